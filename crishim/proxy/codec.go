package proxy

import (
	"bytes"
	"fmt"
)

// frame is one gRPC message, kept as the bytes on the wire.
type frame struct{ payload []byte }

// rawCodec passes messages through without decoding them: the proxy
// forwards bytes, and decodes only the calls it changes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("proxy codec: cannot marshal %T", v)
	}
	return f.payload, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("proxy codec: cannot unmarshal into %T", v)
	}
	// gRPC may reuse data once Unmarshal returns, and may still hold the
	// previous payload of f for sending: copy into a new slice.
	f.payload = bytes.Clone(data)
	return nil
}

// Name is "proto": peers see the content type they expect.
func (rawCodec) Name() string { return "proto" }
