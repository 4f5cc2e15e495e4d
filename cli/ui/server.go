package ui

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
)

//go:embed assets
var assets embed.FS

const (
	// maxStreams bounds the pages streamed to at once.
	maxStreams = 64
	// keepAlive is how often an idle stream is sent a comment, so that
	// proxies keep it open and a closed page is noticed.
	keepAlive = 15 * time.Second
	// explainTimeout bounds one explanation.
	explainTimeout = 30 * time.Second
)

// Explainer judges pod namespace/name on every node as the scheduler
// would; what it returns is sent to the page as JSON.
type Explainer func(ctx context.Context, namespace, name string) (any, error)

// Config is what a Server serves.
type Config struct {
	// Token is what the page must present for data (the page takes it
	// from the URL it was opened with). Empty only with NoToken.
	Token string
	// NoToken serves everyone who reaches the server, for a server behind
	// something else that authenticates (kubectl port-forward).
	NoToken bool
	// Explain answers the page's "why" for a pending pod; nil hides it.
	Explain Explainer
}

// Server serves the page, its assets, the stream of views and
// explanations.
type Server struct {
	cfg     Config
	board   *board
	streams chan struct{} // a slot per open stream
	explain chan struct{} // a slot per running explanation
	mux     *http.ServeMux
	// closed ends the streams (Close).
	closed    chan struct{}
	closeOnce sync.Once
}

// New returns a server that shows nothing until the first Publish.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" && !cfg.NoToken {
		return nil, errors.New("ui: a token is required")
	}
	s := &Server{cfg: cfg, board: newBoard(), streams: make(chan struct{}, maxStreams),
		explain: make(chan struct{}, 2), mux: http.NewServeMux(), closed: make(chan struct{})}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.Handle("GET /api/events", s.authorized(http.HandlerFunc(s.events)))
	s.mux.Handle("GET /api/explain", s.authorized(http.HandlerFunc(s.explainPod)))
	return s, nil
}

// Close ends the open streams (an http.Server's Shutdown waits for them
// otherwise: register it with RegisterOnShutdown).
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// Publish makes v what the pages show.
func (s *Server) Publish(v View) error { return s.board.publish(v) }

// ServeHTTP serves the page and its API, with headers that keep the page
// to its own script and the token out of referrers and caches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// page serves the page, which holds no data: its script reads the token
// from the URL (?token=), keeps it in the tab's session storage (which is
// the origin's alone: scheme, host and port) and drops it from the
// address bar, and presents it with each request for data.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	if !s.hostAllowed(r) {
		http.Error(w, "kubegpu ui: served without a token, only as localhost or an IP address", http.StatusForbidden)
		return
	}
	page, err := assets.ReadFile("assets/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(page)
}

func (s *Server) valid(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), []byte(s.cfg.Token)) == 1
}

// allowed reports whether r carries the token: as a bearer token, or, for
// the stream (EventSource sends no headers), as ?token=.
func (s *Server) allowed(r *http.Request) bool {
	if s.cfg.NoToken {
		return s.hostAllowed(r)
	}
	const bearer = "Bearer "
	if a := r.Header.Get("Authorization"); len(a) > len(bearer) && a[:len(bearer)] == bearer {
		return s.valid(a[len(bearer):])
	}
	if t := r.URL.Query().Get("token"); t != "" {
		return s.valid(t)
	}
	return false
}

// hostAllowed reports whether r names the server as localhost or an IP
// address, where it serves without a token: a page of another site that
// had its name resolve to this address (DNS rebinding) names that site.
// With a token, any name.
func (s *Server) hostAllowed(r *http.Request) bool {
	if !s.cfg.NoToken {
		return true
	}
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	return host == "localhost" || net.ParseIP(strings.Trim(host, "[]")) != nil
}

func (s *Server) authorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.allowed(r) {
			http.Error(w, "kubegpu ui: no token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// events streams the views as server-sent events: the whole view first,
// then what changed, each as one JSON update.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		http.Error(w, fmt.Sprintf("kubegpu ui: %d pages are open already", maxStreams), http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	logger := klog.FromContext(r.Context())
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	var sent seen
	for {
		cur, changed := s.board.latest()
		if cur != nil {
			if u := sent.diff(cur); !u.empty() {
				raw, err := json.Marshal(u)
				if err != nil {
					logger.Error(err, "Encode an update of the page")
					return
				}
				if _, err := fmt.Fprintf(w, "data: %s\n\n", raw); err != nil {
					return
				}
			}
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		case <-changed:
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		}
	}
}

// explainPod answers ?namespace=&pod= with the Explainer's verdict.
func (s *Server) explainPod(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Explain == nil {
		http.Error(w, "kubegpu ui: explanations are off", http.StatusNotFound)
		return
	}
	ns, name := r.URL.Query().Get("namespace"), r.URL.Query().Get("pod")
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		http.Error(w, fmt.Sprintf("kubegpu ui: namespace: %v", errs), http.StatusBadRequest)
		return
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		http.Error(w, fmt.Sprintf("kubegpu ui: pod: %v", errs), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), explainTimeout)
	defer cancel()
	select {
	case s.explain <- struct{}{}:
		defer func() { <-s.explain }()
	case <-ctx.Done():
		http.Error(w, "kubegpu ui: other explanations are running; try again", http.StatusTooManyRequests)
		return
	}
	v, err := s.cfg.Explain(ctx, ns, name)
	if err != nil {
		http.Error(w, "kubegpu ui: "+err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		klog.FromContext(r.Context()).V(2).Info("Send an explanation", "err", err)
	}
}
