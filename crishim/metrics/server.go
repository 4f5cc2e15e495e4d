package metrics

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of the metrics server: a local user or a hostNetwork pod can
// reach its port, and must not be able to hold the shim's file
// descriptors or goroutines.
const (
	// MaxConnections is the most connections the server keeps open. A new
	// connection over it closes the oldest one that is not serving a
	// request, else the oldest that has served one for over
	// ActiveEvictAfter (an answer takes milliseconds: that one is sending
	// a request slowly), else the new one; so a scraper gets in however
	// many connections others hold.
	MaxConnections = 64
	// ActiveEvictAfter is how long a request may take before its
	// connection may be closed for a new one.
	ActiveEvictAfter = time.Second
	// Timeouts of a connection: to send a request's headers, to read the
	// whole request, to write the response, and to idle between requests.
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = 30 * time.Second
	IdleTimeout       = 30 * time.Second
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes = 8 << 10
)

// NewServer returns an HTTP server for h with the limits above.
func NewServer(h http.Handler) *http.Server {
	return newServer(h, newConnCap(MaxConnections, time.Now))
}

// newServer returns an HTTP server for h whose connections c keeps.
func newServer(h http.Handler, c *connCap) *http.Server {
	return &http.Server{
		Handler:           onlyGET(h),
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         c.track,
	}
}

// onlyGET answers GET and HEAD requests without a body; anything else is
// refused and its connection closed, so that no request holds a connection
// by sending a body slowly.
func onlyGET(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method != http.MethodGet && r.Method != http.MethodHead) || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
			http.Error(w, "only GET without a body", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// connCap keeps at most max connections (see MaxConnections).
type connCap struct {
	max   int
	now   func() time.Time
	mu    sync.Mutex
	conns map[net.Conn]connInfo
	seq   uint64
}

func newConnCap(maxConns int, now func() time.Time) *connCap {
	return &connCap{max: maxConns, conns: map[net.Conn]connInfo{}, now: now}
}

type connInfo struct {
	state  http.ConnState
	seq    uint64    // when the connection last became new or idle
	active time.Time // when its request began
}

func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(c.conns, conn)
		return
	case http.StateActive:
		c.conns[conn] = connInfo{state: state, seq: c.conns[conn].seq, active: c.now()}
		return
	}
	c.seq++
	c.conns[conn] = connInfo{state: state, seq: c.seq}
	if state != http.StateNew || len(c.conns) <= c.max {
		return
	}
	// Over the cap: close the oldest connection that serves no request
	// (one that never sent a request, or idles between two), else the
	// longest-serving one past ActiveEvictAfter, else the new one.
	var victim, slow net.Conn
	var oldest uint64
	var since time.Time
	for other, info := range c.conns {
		switch {
		case other == conn:
		case info.state != http.StateActive:
			if victim == nil || info.seq < oldest {
				victim, oldest = other, info.seq
			}
		case c.now().Sub(info.active) > ActiveEvictAfter && (slow == nil || info.active.Before(since)):
			slow, since = other, info.active
		}
	}
	if victim == nil {
		victim = slow
	}
	if victim == nil {
		victim = conn
	}
	delete(c.conns, victim)
	_ = victim.Close()
}
