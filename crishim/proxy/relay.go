package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/kubegpu/kubegpu/crishim/metrics"
)

// relay joins one client connection to its own runtime connection. Both
// peers speak HTTP/2 to each other through it: every frame passes as it
// came (stream IDs, SETTINGS, PINGs, flow control and HPACK state are the
// peers'), so calls behave exactly as the runtime answers them and cost
// two reads and two writes. The relay decodes the client's header blocks
// (to keep an HPACK decoder in step and see each call's method) and takes
// over the request body of intercepted calls:
//
//   - it buffers the body, crediting the client's flow-control windows for
//     what it holds, so a large request cannot stall;
//   - the interceptor's result goes to the runtime as new DATA frames,
//     within the runtime's connection and stream windows, which the relay
//     tracks from the runtime's SETTINGS and WINDOW_UPDATEs; the bytes it
//     added are taken off the runtime's next connection WINDOW_UPDATEs to
//     the client, so both peers' view of the window stays the same;
//   - a refused call is reset at the runtime (RST_STREAM CANCEL) and
//     answered to the client with a gRPC Trailers-Only response encoded
//     without touching the HPACK dynamic table.
//
// The runtime's answer to an intercepted call comes back as any other.
type relay struct {
	p       *Proxy
	client  net.Conn
	backend net.Conn
	ctx     context.Context
	cancel  context.CancelFunc
	logger  klog.Logger

	clientMu  sync.Mutex // serialises writes to the client
	backendMu sync.Mutex // serialises writes to the runtime

	mu     sync.Mutex
	cond   *sync.Cond // signalled when windows grow or the relay closes
	closed bool
	// window is the runtime's connection-level receive window for what is
	// sent on this connection; owed counts bytes the relay sent beyond
	// what the client sent, still to be taken off WINDOW_UPDATEs.
	window, owed int64
	windowWaits  int // times the client pump waited for window (tests watch it)
	// Settings the runtime announced.
	streamWindow int64
	maxFrame     atomic.Int32     // the largest frame the runtime accepts
	calls        map[uint32]*call // intercepted calls in flight
	ncalls       atomic.Int32     // len(calls), read without mu
	// awaiting holds the answered functions of rewritten calls sent to
	// the runtime, until it ends their stream; nawaiting is its length.
	awaiting  map[uint32]func()
	nawaiting atomic.Int32

	headerTable atomic.Uint32 // the runtime's SETTINGS_HEADER_TABLE_SIZE
}

// call is an intercepted call whose request the relay holds.
type call struct {
	id        uint32
	method    string
	intercept Interceptor
	body      []byte
	window    int64 // the runtime's receive window for this stream
	failed    *status.Status
	// ended: the client ended its request; from then on the call belongs
	// to the worker that finishes it, and more frames on the stream are a
	// protocol error.
	ended bool
	// received is when the whole request was in (or the call failed
	// before): the shim's time on the call, for the metrics, starts then.
	received time.Time
	// canceled: the client reset the stream, or the runtime ended it.
	canceled bool
}

func newRelay(p *Proxy, client, backend net.Conn) *relay {
	ctx, cancel := context.WithCancel(context.Background())
	r := &relay{p: p, client: client, backend: backend, ctx: ctx, cancel: cancel, logger: p.logger,
		window: defaultWindow, streamWindow: defaultWindow, calls: map[uint32]*call{}, awaiting: map[uint32]func(){}}
	r.maxFrame.Store(defaultMaxFrame)
	r.cond = sync.NewCond(&r.mu)
	r.headerTable.Store(defaultHeaderTableLen)
	return r
}

// run relays until either side closes or breaks the protocol, then closes
// both connections.
func (r *relay) run() {
	var err, berr error
	var wg sync.WaitGroup
	wg.Go(func() {
		err = r.fromClient()
		r.close()
	})
	wg.Go(func() {
		berr = r.fromBackend()
		r.close()
	})
	wg.Wait()
	switch {
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed):
		r.logger.V(2).Info("CRI client connection closed", "err", err)
	case berr != nil && !errors.Is(berr, net.ErrClosed):
		r.logger.Info("Container runtime connection closed; closing the client's connection so that it reconnects", "err", berr)
	}
}

func (r *relay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.cancel()
	r.client.Close()
	r.backend.Close()
}

func (r *relay) writeClient(b []byte) error {
	r.clientMu.Lock()
	defer r.clientMu.Unlock()
	_, err := r.client.Write(b)
	return err
}

func (r *relay) writeBackend(b []byte) error {
	r.backendMu.Lock()
	defer r.backendMu.Unlock()
	_, err := r.backend.Write(b)
	return err
}

// fromClient relays the client's frames to the runtime.
func (r *relay) fromClient() error {
	fr := newFrameReader(r.client)
	fr.maxLen = func() uint32 { return uint32(r.maxFrame.Load()) }
	preface, err := fr.r.Peek(len(clientPreface))
	if err != nil {
		return err
	}
	if string(preface) != clientPreface {
		return fmt.Errorf("%w: the client did not open with the HTTP/2 preface", errProtocol)
	}
	out := make([]byte, 0, 32<<10)
	out = append(out, preface...)
	_, _ = fr.r.Discard(len(clientPreface))

	var path string
	paths := 0
	dec := hpack.NewDecoder(defaultHeaderTableLen, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			path = f.Value
			paths++
		}
	})
	dec.SetMaxStringLength(maxHeaderBlock)
	var block []byte
	var blockHeader frameHeader
	inBlock := false

	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		err := r.writeBackend(out)
		out = out[:0]
		return err
	}
	for {
		h, f, err := fr.next()
		if err != nil {
			return err
		}
		if inBlock && h.typ != frameContinuation {
			return fmt.Errorf("%w: a %d frame inside a header block", errProtocol, h.typ)
		}
		switch h.typ {
		case frameHeaders, frameContinuation:
			if (h.typ == frameHeaders) == inBlock || (inBlock && h.stream != blockHeader.stream) {
				return fmt.Errorf("%w: header block interrupted", errProtocol)
			}
			frag := f[frameHeaderLen:]
			if h.typ == frameHeaders {
				if frag, err = unpad(h, frag); err != nil {
					return err
				}
				block, blockHeader = block[:0], h
			}
			if len(block)+len(frag) > maxHeaderBlock {
				return fmt.Errorf("%w: header block over %d bytes", errProtocol, maxHeaderBlock)
			}
			block = append(block, frag...)
			out = append(out, f...)
			inBlock = h.flags&flagEndHeaders == 0
			if inBlock {
				continue
			}
			path, paths = "", 0
			dec.SetAllowedMaxDynamicTableSize(r.headerTable.Load())
			if _, err := dec.Write(block); err != nil {
				return fmt.Errorf("decode the client's headers: %w", err)
			}
			if err := dec.Close(); err != nil {
				return fmt.Errorf("decode the client's headers: %w", err)
			}
			if paths > 1 {
				return fmt.Errorf("%w: %d :path fields in one header block", errProtocol, paths)
			}
			if err := r.headers(blockHeader, path, flush); err != nil {
				return err
			}
		case frameData:
			if r.ncalls.Load() > 0 {
				if c := r.call(h.stream); c != nil {
					if err := r.data(c, h, f[frameHeaderLen:], flush); err != nil {
						return err
					}
					break
				}
			}
			if h.length > 0 {
				if err := r.take(int64(h.length), flush); err != nil {
					return err
				}
			}
			out = append(out, f...)
		case frameRSTStream:
			if r.ncalls.Load() > 0 {
				if c := r.call(h.stream); c != nil {
					r.mu.Lock()
					c.canceled = true
					r.cond.Broadcast()
					r.mu.Unlock()
					if !c.ended {
						r.forget(c) // no worker will
					}
				}
			}
			if r.nawaiting.Load() > 0 {
				// The runtime will send nothing more on the stream, and
				// may still be working on the call.
				r.await(h.stream, nil)
			}
			out = append(out, f...)
		default:
			out = append(out, f...)
		}
		if !inBlock && (len(out) >= 64<<10 || !fr.buffered()) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// headers starts intercepting a new call whose method has an
// interceptor. A header block on a call already intercepted (request
// trailers, which gRPC clients do not send) fails that call.
func (r *relay) headers(h frameHeader, path string, flush func() error) error {
	if r.ncalls.Load() > 0 {
		if c := r.call(h.stream); c != nil {
			if c.ended {
				return fmt.Errorf("%w: HEADERS on stream %d after its END_STREAM", errProtocol, h.stream)
			}
			if err := flush(); err != nil {
				return err
			}
			c.received = time.Now()
			r.fail(c, status.New(codes.Internal, "kubegpu-crishim: request trailers are not supported on "+c.method), metrics.ReasonBadRequest)
			return nil
		}
	}
	intercept, ok := r.p.intercept[path]
	if !ok && !strings.HasPrefix(path, "/") && path != "" {
		// gRPC paths are /service/method; some servers accept them
		// without the slash, which would bypass the exact match above.
		intercept, ok = refuseMalformedPath, true
	}
	if !ok || h.flags&flagEndStream != 0 {
		return nil
	}
	r.mu.Lock()
	r.calls[h.stream] = &call{id: h.stream, method: path, intercept: intercept, window: r.streamWindow}
	r.ncalls.Store(int32(len(r.calls)))
	r.mu.Unlock()
	return nil
}

func (r *relay) call(stream uint32) *call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[stream]
}

// refuseMalformedPath fails a call whose :path is not /service/method.
func refuseMalformedPath(context.Context, []byte) ([]byte, func(), error) {
	return nil, nil, &refusal{reason: metrics.ReasonBadRequest,
		st: status.New(codes.Unimplemented, "kubegpu-crishim: malformed method path; want /package.Service/Method")}
}

// data takes one DATA frame of an intercepted call.
func (r *relay) data(c *call, h frameHeader, payload []byte, flush func() error) error {
	if c.ended {
		return fmt.Errorf("%w: DATA on stream %d after its END_STREAM", errProtocol, h.stream)
	}
	p, err := unpad(h, payload)
	if err != nil {
		return err
	}
	if h.length > 0 {
		// The runtime will not see these bytes: credit the client for them.
		var wu []byte
		wu = appendWindowUpdate(wu, 0, h.length)
		if h.flags&flagEndStream == 0 {
			wu = appendWindowUpdate(wu, c.id, h.length)
		}
		if err := r.writeClient(wu); err != nil {
			return err
		}
	}
	if c.failed == nil {
		if len(c.body)+len(p) > maxMessageBytes+5 {
			c.failed = status.Newf(codes.ResourceExhausted, "kubegpu-crishim: %s request larger than %d bytes", c.method, maxMessageBytes)
		} else {
			c.body = append(c.body, p...)
		}
	}
	if h.flags&flagEndStream == 0 {
		return nil
	}
	c.ended, c.received = true, time.Now()
	// The call's HEADERS must reach the runtime before its DATA or reset.
	if err := flush(); err != nil {
		return err
	}
	if !r.p.startCall() {
		r.fail(c, status.New(codes.Unavailable, "kubegpu-crishim is shutting down"), metrics.ReasonShuttingDown)
		return nil
	}
	go func() {
		defer r.p.calls.Done()
		r.finish(c)
	}()
	return nil
}

// finish runs the interceptor on a call's request and sends the result to
// the runtime, or fails the call.
func (r *relay) finish(c *call) {
	if c.failed != nil {
		r.fail(c, c.failed, metrics.ReasonBadRequest)
		return
	}
	msg, err := grpcMessage(c.body)
	if err != nil {
		r.fail(c, status.Newf(codes.InvalidArgument, "kubegpu-crishim: %s: %v", c.method, err), metrics.ReasonBadRequest)
		return
	}
	req, answered, err := c.intercept(klog.NewContext(r.ctx, r.logger), msg)
	if err != nil {
		reason := refusalReason(err)
		r.logger.Error(err, "CRI call refused", "method", c.method, "reason", reason)
		r.fail(c, status.Convert(err), reason)
		return
	}
	c.body = nil
	if answered != nil {
		// Before the request goes out: the runtime may answer before
		// the relay has sent all of it.
		r.await(c.id, answered)
	}
	if err := r.send(c, req); err != nil {
		// The runtime has not had the whole request, so it acts on none.
		if answered := r.await(c.id, nil); answered != nil {
			answered()
		}
		r.logger.V(2).Info("Sending a rewritten request failed", "method", c.method, "err", err)
	} else {
		r.answered(c, "rewritten", "")
	}
	r.forget(c)
}

// answered counts a call the shim answered, with its result (rewritten,
// or the gRPC code of its refusal), its time in the shim, and why it was
// refused (reason, empty for a call sent on). The result is counted last,
// so that whoever sees it counted sees the rest.
func (r *relay) answered(c *call, result string, reason metrics.Reason) {
	m := r.p.metrics
	m.RewriteDuration.With(result).Observe(time.Since(c.received))
	if reason != "" {
		m.Refusals.With(string(reason)).Inc()
	}
	m.CreateContainer.With(result).Inc()
}

// send sends msg as the call's request body, within the runtime's flow
// control windows.
func (r *relay) send(c *call, msg []byte) error {
	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	var frame []byte
	for len(body) > 0 {
		r.mu.Lock()
		n := min(len(body), int(r.maxFrame.Load()))
		for !r.closed && !c.canceled && (r.window <= 0 || c.window <= 0) {
			r.cond.Wait()
		}
		if r.closed || c.canceled {
			r.mu.Unlock()
			return errors.New("the call ended before its request was sent")
		}
		n = int(min(int64(n), r.window, c.window))
		r.window -= int64(n)
		c.window -= int64(n)
		r.owed += int64(n)
		r.mu.Unlock()
		var flags uint8
		if n == len(body) {
			flags = flagEndStream
		}
		frame = appendFrameHeader(frame[:0], n, frameData, flags, c.id)
		frame = append(frame, body[:n]...)
		if err := r.writeBackend(frame); err != nil {
			return err
		}
		body = body[n:]
	}
	return nil
}

// fail resets the call at the runtime and answers the client with st,
// refused for reason. The call stays registered until the reset is
// written, so that no frame of its stream is relayed before it.
func (r *relay) fail(c *call, st *status.Status, reason metrics.Reason) {
	defer r.forget(c)
	r.mu.Lock()
	canceled := c.canceled
	r.mu.Unlock()
	if err := r.writeBackend(appendRSTStream(nil, c.id, errCodeCancel)); err != nil || canceled {
		return
	}
	r.answered(c, st.Code().String(), reason)
	_ = r.writeClient(appendTrailersOnly(nil, c.id, st))
}

func (r *relay) forget(c *call) {
	r.mu.Lock()
	delete(r.calls, c.id)
	r.ncalls.Store(int32(len(r.calls)))
	r.mu.Unlock()
}

// take accounts n bytes the client sends in the runtime's connection
// window, first waiting (after flushing what is already relayed) while
// the client's view of the window is ahead of the runtime's because of
// bytes the relay added.
func (r *relay) take(n int64, flush func() error) error {
	r.mu.Lock()
	if r.window < n && !r.closed {
		r.mu.Unlock()
		if err := flush(); err != nil {
			return err
		}
		r.mu.Lock()
		for r.window < n && !r.closed {
			r.windowWaits++
			r.cond.Wait()
		}
	}
	r.window -= n
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	return nil
}
