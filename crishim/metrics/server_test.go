package metrics

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServerBoundsConnections: idle connections and requests that trickle
// in cannot keep a scrape out.
func TestServerBoundsConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }), 4)
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
	time.Sleep(ActiveEvictAfter + 200*time.Millisecond)
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
