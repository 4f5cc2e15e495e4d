package proxy

// The relay's end of a rewritten call: the runtime's answer, or a reset.

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
