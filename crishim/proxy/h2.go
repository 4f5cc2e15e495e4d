package proxy

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The HTTP/2 framing the proxy reads and writes (RFC 9113). Frames pass
// through as the bytes they are; these are the parts it looks into.
const (
	clientPreface  = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	frameHeaderLen = 9

	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingHeaderTableSize   = 0x1
	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5

	errCodeCancel = 0x8

	// Protocol defaults that hold until the peer's SETTINGS change them.
	defaultWindow         = 65535
	defaultMaxFrame       = 16384
	defaultHeaderTableLen = 4096

	// maxHeaderBlock bounds a request's header block (HEADERS and its
	// CONTINUATIONs), as gRPC bounds a header list.
	maxHeaderBlock = 16 << 20
)

var errProtocol = errors.New("HTTP/2 protocol error")

type frameHeader struct {
	length uint32
	typ    uint8
	flags  uint8
	stream uint32
}

func parseFrameHeader(b []byte) frameHeader {
	return frameHeader{
		length: uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]),
		typ:    b[3],
		flags:  b[4],
		stream: binary.BigEndian.Uint32(b[5:9]) & 0x7fffffff,
	}
}

func appendFrameHeader(b []byte, length int, typ, flags uint8, stream uint32) []byte {
	b = append(b, byte(length>>16), byte(length>>8), byte(length), typ, flags)
	return binary.BigEndian.AppendUint32(b, stream)
}

func appendWindowUpdate(b []byte, stream, increment uint32) []byte {
	b = appendFrameHeader(b, 4, frameWindowUpdate, 0, stream)
	return binary.BigEndian.AppendUint32(b, increment)
}

func appendRSTStream(b []byte, stream, code uint32) []byte {
	b = appendFrameHeader(b, 4, frameRSTStream, 0, stream)
	return binary.BigEndian.AppendUint32(b, code)
}

// unpad returns the content of a DATA or HEADERS frame's payload without
// its padding and (HEADERS) priority fields.
func unpad(h frameHeader, p []byte) ([]byte, error) {
	if h.flags&flagPadded != 0 {
		if len(p) < 1 || int(p[0]) > len(p)-1 {
			return nil, fmt.Errorf("%w: padding longer than the frame", errProtocol)
		}
		p = p[1 : len(p)-int(p[0])]
	}
	if h.typ == frameHeaders && h.flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, fmt.Errorf("%w: HEADERS too short for its priority", errProtocol)
		}
		p = p[5:]
	}
	return p, nil
}

// frameReader reads whole frames from a buffered connection. The frame
// next returns stays valid until the following call.
type frameReader struct {
	r       *bufio.Reader
	pending int    // bytes of the last frame still in r's buffer
	big     []byte // frames larger than r's buffer
	// maxLen, if set, bounds a frame's payload (the peer's
	// SETTINGS_MAX_FRAME_SIZE); a larger frame is an error read no further.
	maxLen func() uint32
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// next returns the next frame, its 9-byte header included.
func (fr *frameReader) next() (frameHeader, []byte, error) {
	if fr.pending > 0 {
		_, _ = fr.r.Discard(fr.pending)
		fr.pending = 0
	}
	hb, err := fr.r.Peek(frameHeaderLen)
	if err != nil {
		return frameHeader{}, nil, err
	}
	h := parseFrameHeader(hb)
	if fr.maxLen != nil && h.length > fr.maxLen() {
		return frameHeader{}, nil, fmt.Errorf("%w: a %d-byte frame, over the %d bytes the receiver accepts", errProtocol, h.length, fr.maxLen())
	}
	n := frameHeaderLen + int(h.length)
	if n <= fr.r.Size() {
		f, err := fr.r.Peek(n)
		if err != nil {
			return frameHeader{}, nil, noEOF(err)
		}
		fr.pending = n
		return h, f, nil
	}
	if cap(fr.big) < n {
		fr.big = make([]byte, n)
	}
	f := fr.big[:n]
	if _, err := io.ReadFull(fr.r, f); err != nil {
		return frameHeader{}, nil, noEOF(err)
	}
	return h, f, nil
}

// buffered reports whether the next frame is already read in whole, so
// that reading it will not block.
func (fr *frameReader) buffered() bool {
	n := fr.r.Buffered() - fr.pending
	if n < frameHeaderLen {
		return false
	}
	hb, _ := fr.r.Peek(fr.pending + frameHeaderLen)
	return n >= frameHeaderLen+int(parseFrameHeader(hb[fr.pending:]).length)
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// grpcMessage returns the one uncompressed message of a unary request
// body (the gRPC length-prefixed message framing).
func grpcMessage(body []byte) ([]byte, error) {
	if len(body) < 5 {
		return nil, errors.New("no request message")
	}
	if body[0] != 0 {
		return nil, errors.New("compressed requests are not supported")
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if uint64(len(body)-5) != uint64(n) {
		return nil, fmt.Errorf("the request body holds %d bytes after the message prefix, the prefix says %d: want exactly one message", len(body)-5, n)
	}
	return body[5:], nil
}

// appendTrailersOnly appends a gRPC "Trailers-Only" response that ends
// stream with st: one HEADERS frame. Every field is encoded as a literal
// that is never indexed, so the client's HPACK dynamic table (shared with
// the responses the runtime encodes) does not change.
func appendTrailersOnly(b []byte, stream uint32, st *status.Status) []byte {
	block := trailersBlock(st, 4096, true)
	if len(block) > defaultMaxFrame {
		// The client's frame size limit is at least this much; keep the
		// code and the start of the message.
		block = trailersBlock(st, 512, false)
	}
	b = appendFrameHeader(b, len(block), frameHeaders, flagEndHeaders|flagEndStream, stream)
	return append(b, block...)
}

func trailersBlock(st *status.Status, maxMessage int, details bool) []byte {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	field := func(name, value string) {
		_ = enc.WriteField(hpack.HeaderField{Name: name, Value: value, Sensitive: true})
	}
	field(":status", "200")
	field("content-type", "application/grpc")
	field("grpc-status", strconv.Itoa(int(st.Code())))
	msg := st.Message()
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	field("grpc-message", encodeGRPCMessage(msg))
	if details && len(st.Details()) > 0 {
		if d, err := proto.Marshal(st.Proto()); err == nil {
			field("grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(d))
		}
	}
	return block.Bytes()
}

// encodeGRPCMessage percent-encodes a grpc-message value as the gRPC
// HTTP/2 protocol asks.
func encodeGRPCMessage(s string) string {
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(s)+16), s[:i]...)
		}
		b = append(b, '%', hex[c>>4], hex[c&0xf])
	}
	if b == nil {
		return s
	}
	return string(b)
}
