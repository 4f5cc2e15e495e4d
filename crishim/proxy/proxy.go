package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
)

// Full method names of the calls the proxy changes.
const (
	methodCreateContainer = "/runtime.v1.RuntimeService/CreateContainer"
	// CRI v1alpha2 (served by containerd 1.x) would create a container
	// without the device rewrite: refused.
	methodCreateContainerV1alpha2 = "/runtime.v1alpha2.RuntimeService/CreateContainer"
)

// maxMessageBytes matches kubelet's CRI client limit.
const maxMessageBytes = 16 << 20

// Interceptor changes one unary call's request before it is forwarded. It
// gets and returns the request message's bytes; an error fails the call
// and should be a gRPC status error (see CreateContainer): other errors
// reach the client as Unknown. CreateContainer's errors also say why, for
// kubegpu_crishim_create_container_refusals_total; other interceptors'
// count as metrics.ReasonOther.
//
// answered, if not nil, is called once the runtime has answered the
// rewritten call (its response ended, whatever the result) or cannot act
// on it (the request could not be sent whole). It is not called when the
// interceptor refuses the call, nor when the runtime or the client resets
// the call after its request was sent or a connection is lost then, for
// the runtime may still be working on it.
type Interceptor func(ctx context.Context, req []byte) (out []byte, answered func(), err error)

// Options configure a Proxy.
type Options struct {
	// Backend is the runtime's CRI unix socket, e.g.
	// unix:///run/containerd/containerd.sock.
	Backend string
	// CreateContainer rewrites CreateContainer requests. Nil forwards
	// them unchanged.
	CreateContainer Interceptor
	// Logger logs connection and call events; klog's global logger if
	// unset.
	Logger *klog.Logger
	// Metrics counts connections and rewrites; optional.
	Metrics *metrics.Shim
}

// Proxy serves CRI on a unix socket and forwards every call to the
// runtime: each client connection gets its own connection to the runtime
// and HTTP/2 frames pass between them unchanged (see relay), so that any
// call, known to this build or not, behaves exactly as the runtime
// answers it, streams included, and costs little more than the copy.
// Only the calls with an interceptor (CreateContainer) are decoded and
// changed.
type Proxy struct {
	backend   string
	intercept map[string]Interceptor
	logger    klog.Logger
	metrics   *metrics.Shim

	calls sync.WaitGroup // intercepted calls being rewritten (Add under mu)

	mu       sync.Mutex
	listener net.Listener
	relays   map[*relay]struct{}
	stopped  bool
	down     bool // the last dial of the runtime failed
}

// New returns a proxy for the runtime at opts.Backend. It connects to
// the runtime once per client connection, so it serves while the runtime
// is down (clients' connections are closed and they reconnect, as they
// would to the runtime itself) and needs no reconnection of its own.
func New(opts Options) (*Proxy, error) {
	path, ok := strings.CutPrefix(opts.Backend, "unix://")
	if !ok || !filepath.IsAbs(path) {
		return nil, fmt.Errorf("container runtime endpoint %q: want unix:///absolute/path/to/the.sock", opts.Backend)
	}
	p := &Proxy{backend: path, intercept: map[string]Interceptor{}, relays: map[*relay]struct{}{}, logger: klog.Background(), metrics: opts.Metrics}
	if opts.Logger != nil {
		p.logger = *opts.Logger
	}
	if p.metrics == nil {
		p.metrics = metrics.New()
	}
	if opts.CreateContainer != nil {
		p.intercept[methodCreateContainer] = opts.CreateContainer
		p.intercept[methodCreateContainerV1alpha2] = func(context.Context, []byte) ([]byte, func(), error) {
			return nil, nil, &refusal{reason: metrics.ReasonBadRequest,
				st: status.New(codes.Unimplemented, "kubegpu-crishim: CRI v1alpha2 CreateContainer is not supported; use CRI v1")}
		}
	}
	return p, nil
}

// Listen opens the unix socket at path, readable and writable by its owner
// only (the CRI socket is root's). A stale socket left by a crash is
// replaced; a socket something still serves on (another shim, or the
// runtime itself when --listen points at it by mistake) and any other file
// are refused.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: a file that is not a socket is there; remove it or choose another --listen", path)
		}
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("listen on %s: something already serves there (another kubegpu-crishim, or the runtime's own socket?)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen on %s: remove the stale socket: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// Serve serves CRI on l until Stop, after which it returns nil.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		l.Close()
		return nil
	}
	p.listener = l
	p.mu.Unlock()
	var delay time.Duration
	for {
		conn, err := l.Accept()
		if err != nil {
			p.mu.Lock()
			stopped := p.stopped
			p.mu.Unlock()
			if stopped {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.logger.Error(err, "Accepting a CRI connection; retrying", "delay", delay)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("accept CRI connections: %w", err)
		}
		delay = 0
		go p.serveConn(conn)
	}
}

// serveConn relays one client connection until it closes. Without the
// runtime the client's connection is closed at once: its calls fail as
// they would against the runtime's own socket, and it reconnects later.
func (p *Proxy) serveConn(conn net.Conn) {
	p.metrics.ConnectionsTotal.Inc()
	backend, err := net.DialTimeout("unix", p.backend, 5*time.Second)
	p.mu.Lock()
	was := p.down
	p.down = err != nil
	p.mu.Unlock()
	if err != nil {
		if !was {
			p.logger.Error(err, "Container runtime unreachable; closing CRI client connections until it is back", "runtime", p.backend)
		}
		p.metrics.RuntimeUnreachable.Inc()
		conn.Close()
		return
	}
	if was {
		p.logger.Info("Container runtime reachable again", "runtime", p.backend)
	}
	r := newRelay(p, conn, backend)
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		r.close()
		return
	}
	p.relays[r] = struct{}{}
	p.mu.Unlock()
	p.metrics.Connections.Add(1)
	defer p.metrics.Connections.Add(-1)
	r.run()
	p.mu.Lock()
	delete(p.relays, r)
	p.mu.Unlock()
}

// startCall counts a call whose rewrite starts, unless the proxy is
// stopping.
func (p *Proxy) startCall() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	p.calls.Add(1)
	return true
}

// Stop stops serving: no new connections are accepted, calls being
// rewritten finish within the grace period, then every connection closes
// (clients see their calls in flight fail and reconnect, as when the
// runtime restarts).
func (p *Proxy) Stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	if p.listener != nil {
		p.listener.Close()
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
	}
	p.mu.Lock()
	relays := make([]*relay, 0, len(p.relays))
	for r := range p.relays {
		relays = append(relays, r)
	}
	p.mu.Unlock()
	for _, r := range relays {
		r.close()
	}
}
