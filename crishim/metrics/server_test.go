package metrics

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"
)

// taken returns how many connections c took in since it was made, while
// none idles between requests.
func (c *connCap) taken() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// closeConn is a connection that only records that it was closed.
type closeConn struct {
	net.Conn
	closed bool
}

func (c *closeConn) Close() error {
	c.closed = true
	return nil
}

// TestConnCapEvictsSlowRequests: with the cap full of connections serving
// requests, a new connection is closed until one of those requests has
// taken longer than ActiveEvictAfter; then the longest-serving one makes
// room.
func TestConnCapEvictsSlowRequests(t *testing.T) {
	clock := testingclock.NewFakePassiveClock(time.Now())
	c := newConnCap(2, clock.Now)
	start := clock.Now()
	first, second, early, late := &closeConn{}, &closeConn{}, &closeConn{}, &closeConn{}
	for _, conn := range []*closeConn{first, second} {
		c.track(conn, http.StateNew)
		c.track(conn, http.StateActive)
		clock.SetTime(clock.Now().Add(time.Millisecond))
	}
	clock.SetTime(start.Add(ActiveEvictAfter))
	c.track(early, http.StateNew)
	clock.SetTime(start.Add(ActiveEvictAfter + time.Millisecond/2))
	c.track(late, http.StateNew)
	if !early.closed || !first.closed || second.closed || late.closed {
		t.Errorf("closed: new before ActiveEvictAfter %v, first request %v, second request %v, new after %v; want true, true, false, false",
			early.closed, first.closed, second.closed, late.closed)
	}
}

// TestServerBoundsConnections: idle connections and requests that trickle
// in cannot keep a scrape out.
func TestServerBoundsConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := newConnCap(4, time.Now)
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), conns)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		return c
	}
	// Four requests that trickle in (headers never finished: the server
	// counts them as new connections, so they go first), then idle
	// connections.
	for i := 0; i < 4; i++ {
		c := dial()
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n")
	}
	for i := 0; i < 20; i++ {
		dial()
	}
	// The scrape comes once the server has taken them all.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return conns.taken() == 24, nil
	}); err != nil {
		t.Fatalf("the server took %d of the 24 connections", conns.taken())
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape with the connections held: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Errorf("scrape: %s %q", resp.Status, body)
	}
	// Anything but a GET without a body is refused.
	resp, err = client.Post("http://"+addr+"/metrics", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}
}
