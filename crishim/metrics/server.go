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
	// request, so a scraper gets in however many idle connections others
	// hold; if every connection is serving a request, the new one is
	// closed.
	MaxConnections = 64
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
	return newServer(h, MaxConnections)
}

func newServer(h http.Handler, maxConns int) *http.Server {
	c := &connCap{max: maxConns, conns: map[net.Conn]connInfo{}}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         c.track,
	}
}

// connCap keeps at most max connections, evicting the oldest idle one.
type connCap struct {
	max   int
	mu    sync.Mutex
	conns map[net.Conn]connInfo
	seq   uint64
}

type connInfo struct {
	state http.ConnState
	seq   uint64 // when the connection last became new or idle
}

func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(c.conns, conn)
		return
	case http.StateActive:
		c.conns[conn] = connInfo{state: state, seq: c.conns[conn].seq}
		return
	}
	c.seq++
	c.conns[conn] = connInfo{state: state, seq: c.seq}
	if state != http.StateNew || len(c.conns) <= c.max {
		return
	}
	// Over the cap: close the oldest connection that serves no request
	// (one that never sent a request, or idles between two).
	var victim net.Conn
	var oldest uint64
	for other, info := range c.conns {
		if other == conn || info.state == http.StateActive {
			continue
		}
		if victim == nil || info.seq < oldest {
			victim, oldest = other, info.seq
		}
	}
	if victim == nil {
		victim = conn
	}
	delete(c.conns, victim)
	_ = victim.Close()
}
