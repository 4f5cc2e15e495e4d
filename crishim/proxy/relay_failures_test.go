package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubegpu/kubegpu/crishim/metrics"
)

func refuseAll(context.Context, []byte) ([]byte, func(), error) {
	return nil, nil, status.Error(codes.PermissionDenied, "refused")
}

func reqHeaders(path string) []byte {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	return block.Bytes()
}

func grpcBody(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	body := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(body[1:], uint32(len(b)))
	return append(body, b...)
}

func frame(typ, flags uint8, stream uint32, p []byte) []byte {
	return append(appendFrameHeader(nil, len(p), typ, flags, stream), p...)
}

// TestRelayRefusesPathWithoutSlash: grpc-go before 1.79.3 (containerd
// 1.7 to 2.1) also routes a :path without its leading slash; the relay
// refuses such paths so that they cannot bypass the rewrite. The runtime
// (here the relay's runtime side, read frame by frame) gets the call's
// HEADERS and a reset, never its request.
func TestRelayRefusesPathWithoutSlash(t *testing.T) {
	p, _ := New(Options{Backend: "unix:///nonexistent", CreateContainer: rewriteOnly(passThrough)})
	client, relayClient := net.Pipe()
	runtime, relayRuntime := net.Pipe()
	go func() { _, _ = drain(client) }()
	r := newRelay(p, relayClient, relayRuntime)
	done := make(chan struct{})
	go func() { r.run(); close(done) }()
	defer func() {
		client.Close()
		runtime.Close()
		<-done
	}()
	var b []byte
	b = append(b, clientPreface...)
	b = append(b, frame(frameSettings, 0, 0, nil)...)
	b = append(b, frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer[1:]))...)
	b = append(b, frame(frameData, flagEndStream, 1, grpcBody(createRequest("main", 10)))...)
	// Relayed as it came, after whatever the relay relays of stream 1.
	b = append(b, frame(framePing, 0, 0, make([]byte, 8))...)
	go func() { _, _ = client.Write(b) }()

	_ = runtime.SetReadDeadline(time.Now().Add(10 * time.Second))
	fr := newFrameReader(runtime)
	if _, err := fr.r.Discard(len(clientPreface)); err != nil {
		t.Fatal(err)
	}
	for ping, reset := false, false; !ping || !reset; {
		h, _, err := fr.next()
		if err != nil {
			t.Fatalf("reading what the runtime gets (PING relayed %v, stream 1 reset %v): %v", ping, reset, err)
		}
		switch {
		case h.typ == frameData && h.stream == 1:
			t.Fatal("the runtime got the request of a call whose :path has no slash")
		case h.typ == framePing:
			ping = true
		case h.typ == frameRSTStream && h.stream == 1:
			reset = true
		}
	}
}

// TestRelayRuntimeDiesWhileClientWaitsForWindow: the runtime connection
// closes while the client pump waits for connection window; the relay
// ends and closes the client's connection.
func TestRelayRuntimeDiesWhileClientWaitsForWindow(t *testing.T) {
	pr := startPipeRelay(t, rewriteOnly(passThrough))
	client, runtime, r, done := pr.client, pr.runtime, pr.r, pr.done
	w := func(b []byte) {
		if _, err := client.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	w([]byte(clientPreface))
	w(frame(frameSettings, 0, 0, nil))
	body := grpcBody(createRequest("main", 1000))
	w(frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer)))
	w(frame(frameData, flagEndStream, 1, body))
	// The relay sends the rewritten body.
	waitRelay(t, r, "send the rewritten body", func() bool { return r.owed > 0 })
	// The client was credited len(body): its window is 65535 again.
	w(frame(frameHeaders, flagEndHeaders, 3, reqHeaders("/runtime.v1.RuntimeService/Version")))
	left := 65535
	for left > 0 {
		n := min(left, 16384)
		w(frame(frameData, 0, 3, make([]byte, n)))
		left -= n
	}
	waitRelay(t, r, "wait for the runtime's window", func() bool { return r.windowWaits > 0 })
	runtime.Close() // the runtime dies
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Errorf("relay still running 3 s after the runtime connection closed")
		r.close() // its pumps may not notice either
	}
}

// TestRelayRuntimeDiesUnderIdleClient: the runtime closes under an idle
// client, whose connection is closed at once.
func TestRelayRuntimeDiesUnderIdleClient(t *testing.T) {
	tp := startProxy(t, refuseAll)
	c, err := net.Dial("unix", filepath.Join(tp.dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(append([]byte(clientPreface), frame(frameSettings, 0, 0, nil)...))
	readRuntimeSettings(t, c)
	tp.backend.Stop()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		if _, err := c.Read(buf); err != nil {
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("client connection still open 3 s after the runtime closed")
			}
			return
		}
	}
}

// TestRelayDataAfterEndStream: DATA after END_STREAM on an intercepted
// stream is a protocol error that ends the connection: the call is
// rewritten once and its body is not touched while the worker has it (run
// with -race).
func TestRelayDataAfterEndStream(t *testing.T) {
	var mu sync.Mutex
	runs := 0
	entered, release := make(chan struct{}, 2), make(chan struct{})
	p, _ := New(Options{Backend: "unix:///nonexistent", CreateContainer: rewriteOnly(func(_ context.Context, b []byte) ([]byte, error) {
		mu.Lock()
		runs++
		mu.Unlock()
		entered <- struct{}{}
		<-release
		return b, nil
	})})
	client, relayClient := net.Pipe()
	runtime, relayRuntime := net.Pipe()
	go func() { _, _ = drain(client) }()
	go func() { _, _ = drain(runtime) }()
	r := newRelay(p, relayClient, relayRuntime)
	done := make(chan struct{})
	go func() { r.run(); close(done) }()
	body := grpcBody(createRequest("main", 10))
	var b []byte
	b = append(b, clientPreface...)
	b = append(b, frame(frameSettings, 0, 0, nil)...)
	b = append(b, frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer))...)
	b = append(b, frame(frameData, flagEndStream, 1, body)...)
	_, _ = client.Write(b)
	select {
	case <-entered: // the worker has the body
	case <-time.After(10 * time.Second):
		t.Fatal("the call was not rewritten")
	}
	go func() { _, _ = client.Write(frame(frameData, flagEndStream, 1, body)) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("relay still running 10 s after DATA after END_STREAM")
		client.Close()
		runtime.Close()
		<-done
	}
	close(release)
	p.Stop(10 * time.Second) // waits for the workers
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Errorf("interceptor ran %d times for one stream", runs)
	}
}

// TestRelayRefusalReasons: the relay's own refusals are counted with
// their gRPC code, time and reason, and never rewritten. (Against a real
// runtime, one that answers a malformed call itself may end it first.)
func TestRelayRefusalReasons(t *testing.T) {
	body := grpcBody(createRequest("main", 10))
	headers := frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer))
	for _, tt := range []struct {
		name   string
		stop   bool
		frames [][]byte
		code   codes.Code
		reason metrics.Reason
	}{
		{name: "stopping", stop: true, frames: [][]byte{headers, frame(frameData, flagEndStream, 1, body)},
			code: codes.Unavailable, reason: metrics.ReasonShuttingDown},
		{name: "path without its slash", frames: [][]byte{frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer[1:])), frame(frameData, flagEndStream, 1, body)},
			code: codes.Unimplemented, reason: metrics.ReasonBadRequest},
		{name: "not a gRPC message", frames: [][]byte{headers, frame(frameData, flagEndStream, 1, []byte("xx"))},
			code: codes.InvalidArgument, reason: metrics.ReasonBadRequest},
		{name: "request trailers", frames: [][]byte{headers, frame(frameData, 0, 1, body), frame(frameHeaders, flagEndHeaders|flagEndStream, 1, nil)},
			code: codes.Internal, reason: metrics.ReasonBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New()
			p, _ := New(Options{Backend: "unix:///nonexistent", Metrics: m, CreateContainer: rewriteOnly(func(context.Context, []byte) ([]byte, error) {
				t.Error("the call was rewritten")
				return nil, status.Error(codes.Internal, "rewritten")
			})})
			if tt.stop {
				p.Stop(0)
			}
			client, relayClient := net.Pipe()
			runtime, relayRuntime := net.Pipe()
			go func() { _, _ = drain(client) }()
			go func() { _, _ = drain(runtime) }()
			r := newRelay(p, relayClient, relayRuntime)
			done := make(chan struct{})
			go func() { r.run(); close(done) }()
			b := append([]byte(clientPreface), frame(frameSettings, 0, 0, nil)...)
			for _, f := range tt.frames {
				b = append(b, f...)
			}
			_, _ = client.Write(b)
			result := tt.code.String()
			for deadline := time.Now().Add(5 * time.Second); m.CreateContainer.With(result).Value() == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if c, n, d := m.CreateContainer.With(result).Value(), m.Refusals.With(string(tt.reason)).Value(), m.RewriteDuration.With(result).Count(); c != 1 || n != 1 || d != 1 {
				t.Errorf("%d %s, %d refusals for %s, %d timed; want 1 each", c, result, n, tt.reason, d)
			}
			client.Close()
			runtime.Close()
			<-done
		})
	}
}

// TestRelayNothingPassesARefusal: a client that keeps sending DATA frames,
// each a whole request, after a refused request on the same stream gets
// none of them to the runtime (grpc-go dispatches a unary handler as soon
// as one message is in, before END_STREAM).
func TestRelayNothingPassesARefusal(t *testing.T) {
	tp := startProxy(t, rewriteOnly(func(context.Context, []byte) ([]byte, error) {
		time.Sleep(200 * time.Microsecond)
		return nil, status.Error(codes.PermissionDenied, "refused")
	}))
	c, err := net.Dial("unix", filepath.Join(tp.dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(append([]byte(clientPreface), frame(frameSettings, 0, 0, nil)...))
	readRuntimeSettings(t, c)
	go func() { _, _ = drain(c) }()
	body := grpcBody(createRequest("smuggled", 10))
	hdr := reqHeaders(methodCreateContainer)
	for s := uint32(1); s < 4000; s += 2 {
		var b []byte
		b = append(b, frame(frameHeaders, flagEndHeaders, s, hdr)...)
		b = append(b, frame(frameData, flagEndStream, s, body)...)
		if _, err := c.Write(b); err != nil {
			break
		}
		for range 8 {
			if _, err := c.Write(frame(frameData, 0, s, body)); err != nil {
				break
			}
		}
	}
	c.Close()
	tp.settle(t)
	tp.fake.mu.Lock()
	defer tp.fake.mu.Unlock()
	if n := len(tp.fake.created); n > 0 {
		t.Errorf("the runtime ran CreateContainer %d times although every request was refused (first: %q)", n, tp.fake.created[0].GetConfig().GetMetadata().GetName())
	}
}

// TestRelayRuntimeEndsStreamDuringSend: the runtime ends an intercepted
// call (here: the rewritten request is over its receive limit) before
// taking the whole body; the relay stops sending and forgets the call.
func TestRelayRuntimeEndsStreamDuringSend(t *testing.T) {
	tp := &testProxy{dir: t.TempDir(), fake: &bigRuntime{}}
	tp.startBackend(t) // grpc-go default: 4 MiB receive limit
	p, err := New(Options{Backend: "unix://" + filepath.Join(tp.dir, "runtime.sock"), CreateContainer: rewriteOnly(func(_ context.Context, b []byte) ([]byte, error) {
		var req runtimeapi.CreateContainerRequest
		_ = proto.Unmarshal(b, &req)
		req.Config.Envs = append(req.Config.Envs, &runtimeapi.KeyValue{Key: "BIG", Value: make([]byte, 2<<20)})
		return proto.Marshal(&req)
	})})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(filepath.Join(tp.dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(l) }()
	conn, err := grpcDial(filepath.Join(tp.dir, "crishim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = runtimeapi.NewRuntimeServiceClient(conn).CreateContainer(context.Background(), createRequest("main", 3<<20))
	t.Logf("CreateContainer: %v", status.Code(err))
	workers := make(chan struct{})
	go func() {
		p.calls.Wait() // the call's worker is the only one
		close(workers)
	}()
	select {
	case <-workers:
	case <-time.After(10 * time.Second):
		t.Error("the rewrite worker is still blocked in send() 10 s after the runtime ended the call")
	}
	p.Stop(0)
}

// TestRelayForgetsCallResetBeforeEnd: a call the client resets before
// END_STREAM is forgotten with its buffered body.
func TestRelayForgetsCallResetBeforeEnd(t *testing.T) {
	pr := startPipeRelay(t, rewriteOnly(passThrough))
	client, runtime, r, done := pr.client, pr.runtime, pr.r, pr.done
	var b []byte
	b = append(b, clientPreface...)
	b = append(b, frame(frameSettings, 0, 0, nil)...)
	b = append(b, frame(frameHeaders, flagEndHeaders, 1, reqHeaders(methodCreateContainer))...)
	b = append(b, frame(frameData, 0, 1, make([]byte, 10000))...)
	b = append(b, appendRSTStream(nil, 1, errCodeCancel)...)
	// A call after the reset: once the relay holds it, it has taken the
	// reset.
	b = append(b, frame(frameHeaders, flagEndHeaders, 3, reqHeaders(methodCreateContainer))...)
	_, _ = client.Write(b)
	waitRelay(t, r, "take the next call", func() bool { return r.calls[3] != nil })
	if r.call(1) != nil || r.ncalls.Load() != 1 {
		t.Errorf("%d call(s) held after the client reset the stream of one and started another", r.ncalls.Load())
	}
	client.Close()
	runtime.Close()
	<-done
}

// framePing is HTTP/2's PING frame, which the relay passes on untouched.
const framePing = 0x6

// waitRelay waits until cond holds, checked under r.mu.
func waitRelay(t *testing.T, r *relay, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return cond(), nil
	}); err != nil {
		t.Fatalf("the relay did not %s within 10 s", what)
	}
}

// readRuntimeSettings reads the runtime's SETTINGS, which the relay passes
// to a client that sent the preface: the relay has its runtime connection.
func readRuntimeSettings(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, _, err := newFrameReader(c).next()
	if err != nil || h.typ != frameSettings {
		t.Fatalf("first frame from the runtime: %+v, %v; want its SETTINGS", h, err)
	}
	_ = c.SetReadDeadline(time.Time{})
}

func grpcDial(sock string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
}
