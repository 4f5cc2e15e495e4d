package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// Full method names of the calls the proxy changes.
const (
	methodCreateContainer = "/runtime.v1.RuntimeService/CreateContainer"
)

// maxMessageBytes matches kubelet's CRI client limit.
const maxMessageBytes = 16 << 20

// Interceptor changes one unary call's request before it is forwarded. It
// gets and returns the request's wire bytes; an error fails the call and
// must be a gRPC status error (see Options.CreateContainer).
type Interceptor func(ctx context.Context, req []byte) ([]byte, error)

// Options configure a Proxy.
type Options struct {
	// Backend is the CRI endpoint calls are forwarded to, e.g.
	// unix:///run/containerd/containerd.sock.
	Backend string
	// CreateContainer rewrites CreateContainer requests.
	CreateContainer Interceptor
}

// unaryMethods are the CRI calls with one request and one response, from
// the generated service descriptions: they are forwarded with a plain
// unary call, cheaper than a stream. Methods this build does not know go
// through the generic stream path.
var unaryMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, sd := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, md := range sd.Methods {
			m["/"+sd.ServiceName+"/"+md.MethodName] = true
		}
	}
	return m
}()

// Proxy serves the CRI RuntimeService and ImageService and forwards every
// call to the backend runtime. Calls are forwarded as bytes, streams
// included, so that any call, known to this build or not, behaves exactly
// as the runtime answers it; only CreateContainer is decoded and changed.
type Proxy struct {
	opts    Options
	backend *grpc.ClientConn
	server  *grpc.Server
}

// New connects to the backend lazily: the proxy serves while the runtime is
// down (calls fail with Unavailable) and reconnects by itself when it is
// back.
func New(opts Options) (*Proxy, error) {
	conn, err := grpc.NewClient(opts.Backend,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}),
			grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to the container runtime at %s: %w", opts.Backend, err)
	}
	p := &Proxy{opts: opts, backend: conn}
	p.server = grpc.NewServer(
		grpc.ForceServerCodec(rawCodec{}),
		grpc.UnknownServiceHandler(p.handle),
		grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes),
	)
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

// Serve serves CRI on l until Stop.
func (p *Proxy) Serve(l net.Listener) error { return p.server.Serve(l) }

// Stop stops serving: new calls are refused, running ones finish within
// the grace period, then the backend connection closes.
func (p *Proxy) Stop(grace time.Duration) {
	done := make(chan struct{})
	go func() {
		p.server.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		p.server.Stop()
	}
	p.backend.Close()
}

// handle forwards one call of any method.
func (p *Proxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "kubegpu-crishim: no method in the stream")
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, md.Copy())
	switch {
	case method == methodCreateContainer && p.opts.CreateContainer != nil:
		return p.unary(ctx, ss, method, p.opts.CreateContainer)
	case unaryMethods[method]:
		return p.unary(ctx, ss, method, nil)
	}
	return p.stream(ctx, ss, method)
}

// unary forwards a unary call, after intercept (if any) changed its
// request.
func (p *Proxy) unary(ctx context.Context, ss grpc.ServerStream, method string, intercept Interceptor) error {
	var req frame
	if err := ss.RecvMsg(&req); err != nil {
		return err
	}
	payload := req.payload
	if intercept != nil {
		var err error
		if payload, err = intercept(ctx, req.payload); err != nil {
			klog.FromContext(ctx).Error(err, "CRI call refused", "method", method)
			return err
		}
	}
	var header, trailer metadata.MD
	var resp frame
	err := p.backend.Invoke(ctx, method, &frame{payload: payload}, &resp, grpc.Header(&header), grpc.Trailer(&trailer))
	if len(header) > 0 {
		_ = ss.SetHeader(header)
	}
	ss.SetTrailer(trailer)
	if err != nil {
		return err
	}
	return ss.SendMsg(&resp)
}

// stream forwards a call of any kind (unary, server or client streaming)
// message by message.
func (p *Proxy) stream(ctx context.Context, ss grpc.ServerStream, method string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := p.backend.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	// Client to runtime.
	sent := make(chan error, 1)
	go func() {
		var f frame
		for {
			if err := ss.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					sent <- cs.CloseSend()
				} else {
					sent <- err
				}
				return
			}
			if err := cs.SendMsg(&f); err != nil {
				sent <- nil // the runtime's answer comes on the receive side
				return
			}
		}
	}()
	// Runtime to client.
	first := true
	var f frame
	for {
		err := cs.RecvMsg(&f)
		if first && !errors.Is(err, io.EOF) {
			// Headers arrive with the first message or the status.
			if h, herr := cs.Header(); herr == nil && len(h) > 0 {
				_ = ss.SetHeader(h)
			}
			first = false
		}
		if err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
		select {
		case err := <-sent:
			if err != nil {
				return err
			}
			sent = nil
		default:
		}
	}
}
