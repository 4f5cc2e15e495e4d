package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
)

// bigRuntime answers ListImages with many images, for responses larger
// than any flow-control window.
type bigRuntime struct{ fakeRuntime }

func (*bigRuntime) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	resp := &runtimeapi.ListImagesResponse{}
	for i := range 5000 {
		resp.Images = append(resp.Images, &runtimeapi.Image{Id: fmt.Sprintf("sha256:%064d", i), RepoTags: []string{fmt.Sprintf("registry.example/image-%d:latest", i)}})
	}
	return resp, nil
}

// testProxy runs a fake runtime and a proxy in front of it with the given
// CreateContainer interceptor.
type testProxy struct {
	dir     string
	fake    *bigRuntime
	backend *grpc.Server
	// ended counts the backend's connections that ended.
	ended   *connEnds
	p       *Proxy
	conn    *grpc.ClientConn
	metrics *metrics.Shim
}

// connEnds counts the connections a gRPC server ended: it read each to
// its end (or broke it off) and started every call it read on it.
type connEnds struct{ n atomic.Uint64 }

func (*connEnds) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (*connEnds) HandleRPC(context.Context, stats.RPCStats)                       {}
func (*connEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (e *connEnds) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); ok {
		e.n.Add(1)
	}
}

func startProxy(t *testing.T, intercept Interceptor) *testProxy {
	t.Helper()
	tp := &testProxy{dir: t.TempDir(), fake: &bigRuntime{}, metrics: metrics.New()}
	tp.startBackend(t)
	p, err := New(Options{Backend: "unix://" + filepath.Join(tp.dir, "runtime.sock"), CreateContainer: intercept, Metrics: tp.metrics})
	if err != nil {
		t.Fatal(err)
	}
	tp.p = p
	l, err := Listen(filepath.Join(tp.dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(l) }()
	t.Cleanup(func() {
		p.Stop(time.Second)
		if err := <-served; err != nil {
			t.Errorf("Serve after Stop: %v", err)
		}
	})
	tp.conn, err = grpc.NewClient("unix://"+filepath.Join(tp.dir, "crishim.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.conn.Close() })
	return tp
}

func (tp *testProxy) startBackend(t *testing.T) {
	t.Helper()
	// Unknown services read their request first, as containerd 1.x's
	// CRI v1alpha2 service does, and count it as created.
	tp.ended = &connEnds{}
	tp.backend = grpc.NewServer(grpc.StatsHandler(tp.ended), grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		var req runtimeapi.CreateContainerRequest
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		tp.fake.mu.Lock()
		tp.fake.created = append(tp.fake.created, &req)
		tp.fake.mu.Unlock()
		return status.Error(codes.Unimplemented, "unknown service")
	}))
	runtimeapi.RegisterRuntimeServiceServer(tp.backend, tp.fake)
	runtimeapi.RegisterImageServiceServer(tp.backend, tp.fake)
	bl, err := net.Listen("unix", filepath.Join(tp.dir, "runtime.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tp.backend.Serve(bl) }()
	t.Cleanup(tp.backend.Stop)
}

// settle closes tp.conn and returns once every connection of the proxy
// (the caller closes its own) has ended and the runtime has ended its
// side and finished every call it started; it stops the runtime. After
// it, fake.created holds every request that reached the runtime.
func (tp *testProxy) settle(t *testing.T) {
	t.Helper()
	tp.conn.Close()
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		dialled := tp.metrics.ConnectionsTotal.Value() - tp.metrics.RuntimeUnreachable.Value()
		return tp.metrics.Connections.Value() == 0 && tp.ended.n.Load() == dialled, nil
	}); err != nil {
		t.Fatalf("10 s after the clients closed: %d connections open, the runtime ended %d of the %d the proxy made",
			tp.metrics.Connections.Value(), tp.ended.n.Load(), tp.metrics.ConnectionsTotal.Value()-tp.metrics.RuntimeUnreachable.Value())
	}
	stopped := make(chan struct{})
	go func() {
		tp.backend.GracefulStop() // waits for the calls' handlers
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the runtime's calls still running 10 s after their connections ended")
	}
}

// relays returns the proxy's relays, one per client connection.
func (tp *testProxy) relays() []*relay {
	tp.p.mu.Lock()
	defer tp.p.mu.Unlock()
	var rs []*relay
	for r := range tp.p.relays {
		rs = append(rs, r)
	}
	return rs
}

// addEnv appends one env var to the request: the rewritten request is
// larger than the client's.
func addEnv(_ context.Context, b []byte) ([]byte, error) {
	var req runtimeapi.CreateContainerRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetConfig().GetMetadata().GetName() == "refuse" {
		return nil, status.Error(codes.PermissionDenied, "kubegpu-crishim: refused\nsecond line 100%")
	}
	req.Config.Envs = append(req.Config.Envs, &runtimeapi.KeyValue{Key: "ADDED", Value: []byte(strings.Repeat("x", 300))})
	return proto.Marshal(&req)
}

func createRequest(name string, annotationBytes int) *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{
		PodSandboxId: "sb",
		Config:       &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod"},
			Annotations: map[string]string{"big": strings.Repeat("a", annotationBytes)}},
	}
}

// TestRelayLargeRequestsAndResponses: requests larger than the stream and
// connection windows and than a frame are rewritten whole; responses
// larger than the windows pass through.
func TestRelayLargeRequestsAndResponses(t *testing.T) {
	tp := startProxy(t, rewriteOnly(addEnv))
	rt := runtimeapi.NewRuntimeServiceClient(tp.conn)
	ctx := context.Background()
	for _, size := range []int{0, 16 << 10, 100 << 10, 3 << 20} {
		if _, err := rt.CreateContainer(ctx, createRequest("main", size)); err != nil {
			t.Fatalf("CreateContainer with %d bytes of annotations: %v", size, err)
		}
		tp.fake.mu.Lock()
		got := tp.fake.created[len(tp.fake.created)-1]
		tp.fake.mu.Unlock()
		if len(got.GetSandboxConfig().GetAnnotations()["big"]) != size || len(got.GetConfig().GetEnvs()) != 1 {
			t.Errorf("runtime got %d bytes of annotations and envs %d, want %d and the added env", len(got.GetSandboxConfig().GetAnnotations()["big"]), len(got.GetConfig().GetEnvs()), size)
		}
	}
	imgs, err := runtimeapi.NewImageServiceClient(tp.conn).ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil || len(imgs.GetImages()) != 5000 {
		t.Fatalf("ListImages: %d images, %v", len(imgs.GetImages()), err)
	}
}

// TestRelayConcurrentCalls: many calls at once on one connection, some
// rewritten, some refused by the relay, the rest passed through; every
// answer is the right one and the connection stays usable (a refusal
// written into the response stream would break the client's HPACK state).
func TestRelayConcurrentCalls(t *testing.T) {
	tp := startProxy(t, rewriteOnly(addEnv))
	rt := runtimeapi.NewRuntimeServiceClient(tp.conn)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := range 300 {
		wg.Go(func() {
			switch i % 3 {
			case 0:
				if _, err := rt.CreateContainer(ctx, createRequest(fmt.Sprintf("c%d", i), 20<<10)); err != nil {
					errs <- fmt.Errorf("CreateContainer: %w", err)
				}
			case 1:
				_, err := rt.CreateContainer(ctx, createRequest("refuse", i))
				if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != "kubegpu-crishim: refused\nsecond line 100%" {
					errs <- fmt.Errorf("refused CreateContainer: %w", err)
				}
			case 2:
				_, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: fmt.Sprintf("id-%d", i)})
				if !strings.Contains(fmt.Sprint(err), fmt.Sprintf(`"id-%d" not found`, i)) {
					errs <- fmt.Errorf("ContainerStatus: %w", err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tp.fake.mu.Lock()
	defer tp.fake.mu.Unlock()
	if len(tp.fake.created) != 100 {
		t.Errorf("runtime created %d containers, want 100 (refused ones must not reach it)", len(tp.fake.created))
	}
	// A rewritten call is counted once its request reached the runtime,
	// which may answer first.
	for deadline := time.Now().Add(5 * time.Second); tp.metrics.CreateContainer.With("rewritten").Value() < 100 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if r, d := tp.metrics.CreateContainer.With("rewritten").Value(), tp.metrics.CreateContainer.With("PermissionDenied").Value(); r != 100 || d != 100 {
		t.Errorf("metrics: %d rewritten, %d refused; want 100 and 100", r, d)
	}
	if r, d := tp.metrics.RewriteDuration.With("rewritten").Count(), tp.metrics.RewriteDuration.With("PermissionDenied").Count(); r != 100 || d != 100 {
		t.Errorf("metrics: %d rewritten and %d refused calls timed; want 100 and 100", r, d)
	}
	// addEnv's refusals do not say why.
	if n := tp.metrics.Refusals.With(string(metrics.ReasonOther)).Value(); n != 100 {
		t.Errorf("metrics: %d refusals for reason other, want 100", n)
	}
	if c := tp.metrics.Connections.Value(); c != 1 {
		t.Errorf("metrics: %d open connections, want 1", c)
	}
}

// TestRelayRefusesCRIv1alpha2CreateContainer: containerd 1.x also serves
// CRI v1alpha2, whose CreateContainer would bypass the device rewrite.
func TestRelayRefusesCRIv1alpha2CreateContainer(t *testing.T) {
	tp := startProxy(t, rewriteOnly(addEnv))
	err := tp.conn.Invoke(context.Background(), "/runtime.v1alpha2.RuntimeService/CreateContainer", createRequest("main", 0), &runtimeapi.CreateContainerResponse{})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "use CRI v1") {
		t.Errorf("v1alpha2 CreateContainer: %v", err)
	}
	if n := tp.metrics.Refusals.With(string(metrics.ReasonBadRequest)).Value(); n != 1 {
		t.Errorf("metrics: %d refusals for reason bad_request, want 1", n)
	}
	tp.fake.mu.Lock()
	defer tp.fake.mu.Unlock()
	if len(tp.fake.created) != 0 {
		t.Error("the v1alpha2 request reached the runtime")
	}
}

// TestRelayClientCancelsDuringRewrite: a call the client gives up on while
// it is being rewritten never reaches the runtime, and the connection
// goes on.
func TestRelayClientCancelsDuringRewrite(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	tp := startProxy(t, rewriteOnly(func(ctx context.Context, b []byte) ([]byte, error) {
		entered <- struct{}{}
		<-release
		return b, nil
	}))
	rt := runtimeapi.NewRuntimeServiceClient(tp.conn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := rt.CreateContainer(ctx, createRequest("main", 0))
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("canceled CreateContainer: %v", err)
	}
	// The client's RST_STREAM reached the relay before the rewrite ends.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, r := range tp.relays() {
			r.mu.Lock()
			for _, c := range r.calls {
				if c.canceled {
					r.mu.Unlock()
					return true, nil
				}
			}
			r.mu.Unlock()
		}
		return false, nil
	}); err != nil {
		t.Fatal("the relay did not see the client cancel the call")
	}
	close(release)
	if _, err := rt.Version(context.Background(), &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	tp.settle(t)
	tp.fake.mu.Lock()
	defer tp.fake.mu.Unlock()
	if len(tp.fake.created) != 0 {
		t.Errorf("the canceled call reached the runtime")
	}
}

// TestRelayRuntimeRestart: a client keeps its connection to the proxy
// while the runtime goes away and comes back; its calls fail meanwhile
// and work again once the runtime is back, without a new client.
func TestRelayRuntimeRestart(t *testing.T) {
	tp := startProxy(t, rewriteOnly(addEnv))
	rt := runtimeapi.NewRuntimeServiceClient(tp.conn)
	ctx := context.Background()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	tp.backend.Stop()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Version with the runtime down: %v, want Unavailable", err)
	}

	tp.startBackend(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Version 10 s after the runtime came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := rt.CreateContainer(ctx, createRequest("main", 0)); err != nil {
		t.Error(err)
	}
}

// TestRuntimeUnreachable: with no runtime, calls fail with Unavailable, as
// against the runtime's own socket, and the closed connections are counted.
func TestRuntimeUnreachable(t *testing.T) {
	dir := t.TempDir()
	m := metrics.New()
	p, err := New(Options{Backend: "unix://" + filepath.Join(dir, "none.sock"), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(filepath.Join(dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(l) }()
	defer p.Stop(0)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "crishim.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).Version(context.Background(), &runtimeapi.VersionRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("Version without a runtime: %v, want Unavailable", err)
	}
	if m.RuntimeUnreachable.Value() == 0 || m.Connections.Value() != 0 {
		t.Errorf("metrics: %d connections closed for an unreachable runtime, %d open", m.RuntimeUnreachable.Value(), m.Connections.Value())
	}
}

func TestNewRefusesOtherEndpoints(t *testing.T) {
	for _, e := range []string{"", "/run/containerd/containerd.sock", "tcp://127.0.0.1:1", "unix://relative.sock"} {
		if _, err := New(Options{Backend: e}); err == nil || !strings.Contains(err.Error(), "unix:///absolute") {
			t.Errorf("New(%q): %v", e, err)
		}
	}
}

func TestEncodeGRPCMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain":           "plain",
		"100% sure":       "100%25 sure",
		"two\nlines":      "two%0Alines",
		"gr\u00fc\u00dfe": "gr%C3%BC%C3%9Fe",
	} {
		if got := encodeGRPCMessage(in); got != want {
			t.Errorf("encodeGRPCMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestGRPCMessage(t *testing.T) {
	msg := func(flag byte, n uint32, body string) []byte {
		b := []byte{flag, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], n)
		return append(b, body...)
	}
	if got, err := grpcMessage(msg(0, 3, "abc")); err != nil || string(got) != "abc" {
		t.Errorf("one message: %q, %v", got, err)
	}
	for name, body := range map[string][]byte{
		"empty":      nil,
		"compressed": msg(1, 3, "abc"),
		"short":      msg(0, 4, "abc"),
		"two":        append(msg(0, 1, "a"), msg(0, 1, "b")...),
	} {
		if _, err := grpcMessage(body); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// FuzzRelayClientFrames feeds arbitrary bytes after the preface to a
// relay that intercepts CreateContainer: it never panics, and it ends
// when the client goes away.
func FuzzRelayClientFrames(f *testing.F) {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, kv := range [][2]string{{":method", "POST"}, {":path", methodCreateContainer}, {"content-type", "application/grpc"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	var seed []byte
	seed = appendFrameHeader(seed, 0, frameSettings, 0, 0)
	seed = appendFrameHeader(seed, block.Len(), frameHeaders, flagEndHeaders, 1)
	seed = append(seed, block.Bytes()...)
	msg := []byte{0, 0, 0, 0, 2, 0x0a, 0x00}
	seed = appendFrameHeader(seed, len(msg), frameData, flagEndStream, 1)
	seed = append(seed, msg...)
	f.Add(seed)
	f.Add(appendFrameHeader(nil, 5, frameHeaders, flagPadded|flagEndHeaders, 1))
	f.Add(appendFrameHeader(nil, 0, frameContinuation, flagEndHeaders, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		pr := startPipeRelay(t, rewriteOnly(passThrough))
		_, _ = pr.client.Write(append([]byte(clientPreface), data...))
		pr.client.Close()
		pr.runtime.Close()
		select {
		case <-pr.done:
		case <-time.After(10 * time.Second):
			t.Fatal("relay still running 10 s after both peers closed")
		}
	})
}

// pipeRelay is a relay between in-memory connections: a test writes the
// client's (or the runtime's) bytes to client (runtime); what the relay
// writes to either is read and dropped. done is closed when the relay ends.
type pipeRelay struct {
	r               *relay
	client, runtime net.Conn
	done            chan struct{}
}

func startPipeRelay(t testing.TB, intercept Interceptor) *pipeRelay {
	t.Helper()
	p, err := New(Options{Backend: "unix:///nonexistent", CreateContainer: intercept})
	if err != nil {
		t.Fatal(err)
	}
	pr := &pipeRelay{done: make(chan struct{})}
	var relayClient, relayRuntime net.Conn
	pr.client, relayClient = net.Pipe()
	pr.runtime, relayRuntime = net.Pipe()
	go func() { _, _ = drain(pr.client) }()
	go func() { _, _ = drain(pr.runtime) }()
	pr.r = newRelay(p, relayClient, relayRuntime)
	go func() {
		pr.r.run()
		close(pr.done)
	}()
	return pr
}

func passThrough(_ context.Context, b []byte) ([]byte, error) { return b, nil }

// rewriteOnly is an interceptor that rewrites with f and has nothing to do
// once the runtime answers.
func rewriteOnly(f func(context.Context, []byte) ([]byte, error)) Interceptor {
	return func(ctx context.Context, b []byte) ([]byte, func(), error) {
		out, err := f(ctx, b)
		return out, nil, err
	}
}

// drain reads c until it fails.
func drain(c net.Conn) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, err := c.Read(buf)
		n += int64(m)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return n, nil
			}
			return n, err
		}
	}
}

// TestTrailersOnlyFitsAFrame: a refusal with a long message and large
// details still fits the smallest frame size a client may allow, and
// decodes.
func TestTrailersOnlyFitsAFrame(t *testing.T) {
	st := status.New(codes.PermissionDenied, strings.Repeat("\u00fc%\n", 3000))
	st, err := st.WithDetails(&runtimeapi.VersionResponse{RuntimeName: strings.Repeat("d", 9000)})
	if err != nil {
		t.Fatal(err)
	}
	f := appendTrailersOnly(nil, 7, st)
	h := parseFrameHeader(f)
	if h.length > defaultMaxFrame || h.typ != frameHeaders || h.flags != flagEndHeaders|flagEndStream || h.stream != 7 {
		t.Fatalf("frame header %+v", h)
	}
	fields, err := hpack.NewDecoder(4096, nil).DecodeFull(f[frameHeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fields {
		got[f.Name] = f.Value
	}
	if got["grpc-status"] != "7" || !strings.HasPrefix(got["grpc-message"], "%C3%BC%25%0A") {
		t.Errorf("fields %v", got)
	}
}

// TestRelayRefusesOversizedClientFrames: a client frame larger than the
// runtime's SETTINGS_MAX_FRAME_SIZE ends the connection before the relay
// reads (or buffers) its payload.
func TestRelayRefusesOversizedClientFrames(t *testing.T) {
	pr := startPipeRelay(t, nil)
	_, _ = pr.client.Write(append([]byte(clientPreface), appendFrameHeader(nil, 1<<20, frameData, 0, 1)...))
	select {
	case <-pr.done:
	case <-time.After(5 * time.Second):
		t.Fatal("relay still running after a 1 MiB frame header")
	}
	pr.client.Close()
	pr.runtime.Close()
}

// TestRelayCallsAnsweredOnTheAnswer: an interceptor's answered function
// runs once the runtime has answered the rewritten call, and never for a
// call the interceptor refused.
func TestRelayCallsAnsweredOnTheAnswer(t *testing.T) {
	var mu sync.Mutex
	var answered []string
	tp := startProxy(t, func(ctx context.Context, b []byte) ([]byte, func(), error) {
		out, err := addEnv(ctx, b)
		var req runtimeapi.CreateContainerRequest
		_ = proto.Unmarshal(b, &req)
		name := req.GetConfig().GetMetadata().GetName()
		return out, func() {
			mu.Lock()
			answered = append(answered, name)
			mu.Unlock()
		}, err
	})
	rt := runtimeapi.NewRuntimeServiceClient(tp.conn)
	ctx := context.Background()
	if _, err := rt.CreateContainer(ctx, createRequest("refuse", 0)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refused call: %v", err)
	}
	// A call whose client gives up while the runtime works on it: the
	// runtime may still create the container, so it is not answered.
	tp.fake.mu.Lock()
	tp.fake.hold = true
	tp.fake.mu.Unlock()
	held, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := rt.CreateContainer(held, createRequest("held", 0))
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("held call: %v, want DeadlineExceeded", err)
	}
	for _, name := range []string{"first", "second"} {
		if _, err := rt.CreateContainer(ctx, createRequest(name, 100<<10)); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(answered, name), nil
		}); err != nil {
			t.Fatalf("the answered function of call %s did not run after its answer", name)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(answered, []string{"first", "second"}) {
		t.Errorf("answered ran for %v, want [first second] (never for the refused call, nor for the one its client gave up)", answered)
	}
}
