package advertiser

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestClientRequests: the REST client sends what the API server expects
// (paths, verbs, JSON) and returns its errors decoded.
func TestClientRequests(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("Accept"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/api/v1/nodes/n1" && r.Method == http.MethodGet:
			_, _ = io.WriteString(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","uid":"u-1"}}`)
		case r.URL.Path == "/api/v1/nodes/gone":
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"gone\" is forbidden: RBAC says no","reason":"Forbidden","code":403}`)
		case strings.HasSuffix(r.URL.Path, "/leases/missing"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		default:
			if r.Method != http.MethodGet && !json.Valid(body) {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			_, _ = w.Write(body)
		}
	}))
	defer srv.Close()
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if m, err := c.NodeMeta(ctx, "n1"); err != nil || m.UID != "u-1" {
		t.Errorf("NodeMeta = %+v, %v", m, err)
	}
	if _, err := c.NodeMeta(ctx, "gone"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "RBAC says no") {
		t.Errorf("NodeMeta of a forbidden node: %v, want the API server's message", err)
	}
	if _, err := c.GetLease(ctx, "kube-node-lease", "missing"); !apierrors.IsNotFound(err) {
		t.Errorf("GetLease of a missing lease: %v, want NotFound", err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kubegpu-n1", Namespace: "kube-node-lease"}}
	if err := c.CreateLease(ctx, lease); err != nil {
		t.Error(err)
	}
	if err := c.UpdateLease(ctx, lease); err != nil {
		t.Error(err)
	}
	if err := c.PatchNode(ctx, "n1", []byte(`{"status":{}}`), "status"); err != nil {
		t.Error(err)
	}
	want := []string{
		"GET /api/v1/nodes/n1  application/json",
		"GET /api/v1/nodes/gone  application/json",
		"GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/missing  application/json",
		"POST /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases application/json application/json",
		"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/kubegpu-n1 application/json application/json",
		"PATCH /api/v1/nodes/n1/status application/merge-patch+json application/json",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
