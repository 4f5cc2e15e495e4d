package proxy

import "encoding/binary"

// The runtime's side of a relay: its frames, the settings and windows
// they set, and the end of each rewritten call (its answer, or a reset).

// ended stops sending the request of an intercepted call whose stream the
// runtime ended (answered or reset) before taking all of it, and calls the
// answered function of a rewritten call the runtime answered.
func (r *relay) ended(stream uint32, answer bool) {
	if r.ncalls.Load() == 0 && r.nawaiting.Load() == 0 {
		return
	}
	r.mu.Lock()
	if c := r.calls[stream]; c != nil {
		c.canceled = true
		r.cond.Broadcast()
	}
	answered := r.awaiting[stream]
	delete(r.awaiting, stream)
	r.nawaiting.Store(int32(len(r.awaiting)))
	r.mu.Unlock()
	if answer && answered != nil {
		// Off the runtime's frames: it may wait for a lock.
		go answered()
	}
}

// await keeps answered until the runtime ends the stream; nil forgets the
// stream's and returns it.
func (r *relay) await(stream uint32, answered func()) (was func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	was = r.awaiting[stream]
	if answered == nil {
		delete(r.awaiting, stream)
	} else {
		r.awaiting[stream] = answered
	}
	r.nawaiting.Store(int32(len(r.awaiting)))
	return was
}

// fromBackend relays the runtime's frames to the client, reading the
// settings and window updates the relay must follow.
func (r *relay) fromBackend() error {
	fr := newFrameReader(r.backend)
	out := make([]byte, 0, 32<<10)
	inBlock := false
	for {
		h, f, err := fr.next()
		if err != nil {
			return err
		}
		switch h.typ {
		case frameSettings:
			if h.flags&flagAck == 0 {
				r.settings(f[frameHeaderLen:])
			}
			out = append(out, f...)
		case frameWindowUpdate:
			if h.length != 4 {
				out = append(out, f...) // the client reports the error
				break
			}
			inc := int64(binary.BigEndian.Uint32(f[frameHeaderLen:]) & 0x7fffffff)
			if h.stream == 0 {
				r.mu.Lock()
				r.window += inc
				taken := min(inc, r.owed)
				r.owed -= taken
				r.cond.Broadcast()
				r.mu.Unlock()
				switch {
				case taken == 0:
					out = append(out, f...)
				case inc > taken:
					out = appendWindowUpdate(out, 0, uint32(inc-taken))
				}
				break
			}
			if r.ncalls.Load() > 0 {
				r.mu.Lock()
				c := r.calls[h.stream]
				if c != nil {
					c.window += inc
					r.cond.Broadcast()
				}
				r.mu.Unlock()
				if c != nil {
					break // credit for the relay's own DATA
				}
			}
			out = append(out, f...)
		case frameHeaders, framePushPromise:
			inBlock = h.flags&flagEndHeaders == 0
			if h.typ == frameHeaders && h.flags&flagEndStream != 0 {
				r.ended(h.stream, true)
			}
			out = append(out, f...)
		case frameRSTStream:
			r.ended(h.stream, false)
			out = append(out, f...)
		case frameContinuation:
			inBlock = h.flags&flagEndHeaders == 0
			out = append(out, f...)
		default:
			out = append(out, f...)
		}
		if !inBlock && len(out) > 0 && (len(out) >= 64<<10 || !fr.buffered()) {
			if err := r.writeClient(out); err != nil {
				return err
			}
			out = out[:0]
		}
	}
}

// settings follows the runtime's SETTINGS that bound what the relay
// sends and decodes.
func (r *relay) settings(p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ; len(p) >= 6; p = p[6:] {
		v := binary.BigEndian.Uint32(p[2:6])
		switch binary.BigEndian.Uint16(p[:2]) {
		case settingHeaderTableSize:
			r.headerTable.Store(v)
		case settingInitialWindowSize:
			delta := int64(v) - r.streamWindow
			r.streamWindow = int64(v)
			for _, c := range r.calls {
				c.window += delta
			}
			r.cond.Broadcast()
		case settingMaxFrameSize:
			if v >= defaultMaxFrame && v < 1<<24 {
				r.maxFrame.Store(int32(v))
			}
		}
	}
}
