package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const testToken = "0123456789abcdef0123"

func newTestServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Token == "" && !cfg.NoToken {
		cfg.Token = testToken
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, hs
}

func get(t *testing.T, c *http.Client, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestToken: without the token, no data: the page (which holds none), its
// assets and the health check only; the token is taken as a bearer token
// or, for the stream, in the URL; no cookie is set.
func TestToken(t *testing.T) {
	_, hs := newTestServer(t, Config{Explain: func(context.Context, string, string) (any, error) { return "ok", nil }})
	for _, path := range []string{"/api/events", "/api/explain?namespace=a&pod=b", "/api/explain?namespace=a&pod=b&token=wrong-token-000000"} {
		if resp := get(t, http.DefaultClient, hs.URL+path); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %s, want 401", path, resp.Status)
		}
	}
	if resp := get(t, http.DefaultClient, hs.URL+"/api/explain?namespace=a&pod=b", "Authorization", "Bearer "+testToken); resp.StatusCode != http.StatusOK {
		t.Errorf("explain with the bearer token: %s", resp.Status)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/api/events?token="+testToken, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the stream with ?token=: %s", resp.Status)
	}
	cancel()
	resp.Body.Close()
	for _, path := range []string{"/", "/?token=" + testToken, "/assets/app.js", "/healthz"} {
		resp := get(t, http.DefaultClient, hs.URL+path)
		if resp.StatusCode != http.StatusOK || len(resp.Cookies()) > 0 {
			t.Errorf("GET %s: %s, cookies %v", path, resp.Status, resp.Cookies())
		}
	}
	page := get(t, http.DefaultClient, hs.URL+"/")
	csp := page.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if page.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Error("the page may send its URL (and token) as a referrer")
	}
	if _, err := New(Config{}); err == nil {
		t.Error("a server without a token or NoToken was made")
	}
}

// TestNoTokenHost: served without a token, only to requests that name the
// server as localhost or an IP address (not a rebinding site's name).
func TestNoTokenHost(t *testing.T) {
	_, hs := newTestServer(t, Config{NoToken: true})
	for host, want := range map[string]int{"": http.StatusOK, "localhost:8080": http.StatusOK, "[::1]:80": http.StatusOK, "evil.example:8080": http.StatusForbidden} {
		for _, path := range []string{"/", "/api/events?x=1"} {
			req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
			if host != "" {
				req.Host = host
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := http.DefaultClient.Do(req.WithContext(ctx))
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			got := resp.StatusCode
			if path != "/" && want == http.StatusForbidden {
				want = http.StatusUnauthorized
			}
			resp.Body.Close()
			cancel()
			if got != want {
				t.Errorf("GET %s as host %q: %d, want %d", path, host, got, want)
			}
		}
	}
}

// TestExplainChecksNames: the pod's name and namespace are checked before
// the explainer is asked.
func TestExplainChecksNames(t *testing.T) {
	asked := 0
	_, hs := newTestServer(t, Config{NoToken: true, Explain: func(context.Context, string, string) (any, error) { asked++; return nil, nil }})
	for _, q := range []string{"namespace=A&pod=b", "namespace=a&pod=", "namespace=a/b&pod=c", "namespace=a&pod=" + strings.Repeat("x", 300)} {
		if resp := get(t, http.DefaultClient, hs.URL+"/api/explain?"+q); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("explain %s: %s, want 400", q, resp.Status)
		}
	}
	if asked != 0 {
		t.Errorf("the explainer was asked %d times", asked)
	}
}

type testNode struct {
	Name  string `json:"name"`
	Value int    `json:"value"`
}

func view(values map[string]int, order ...string) View {
	v := View{Summary: map[string]int{"n": len(order)}}
	for _, name := range order {
		v.Nodes = append(v.Nodes, NamedNode{Name: name, Data: testNode{name, values[name]}})
	}
	return v
}

// TestStream: a page gets the whole view, then only the nodes that
// changed, those removed, and the summary when it changed.
func TestStream(t *testing.T) {
	s, hs := newTestServer(t, Config{NoToken: true})
	if err := s.Publish(view(map[string]int{"a": 1, "b": 1}, "a", "b")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	next := func() update {
		t.Helper()
		for lines.Scan() {
			if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
				var u update
				if err := json.Unmarshal([]byte(data), &u); err != nil {
					t.Fatal(err)
				}
				return u
			}
		}
		t.Fatalf("stream ended: %v", lines.Err())
		return update{}
	}
	if u := next(); !u.Full || len(u.Nodes) != 2 || len(u.Order) != 2 || u.Summary == nil {
		t.Fatalf("first update %+v, want the whole view", u)
	}
	if err := s.Publish(view(map[string]int{"a": 2, "b": 1}, "a", "b")); err != nil {
		t.Fatal(err)
	}
	if u := next(); u.Full || len(u.Nodes) != 1 || !strings.Contains(string(u.Nodes[0]), `"value":2`) || u.Order != nil || u.Summary != nil {
		t.Fatalf("update %+v, want node a alone", u)
	}
	if err := s.Publish(view(map[string]int{"a": 2}, "a")); err != nil {
		t.Fatal(err)
	}
	if u := next(); len(u.Nodes) != 0 || len(u.Removed) != 1 || u.Removed[0] != "b" || len(u.Order) != 1 || u.Summary == nil {
		t.Fatalf("update %+v, want b removed and the summary", u)
	}
	if err := s.Publish(view(nil, "a", "a")); err == nil {
		t.Error("a view with a node twice was published")
	}
}
