package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// startUI starts `kubegpu ui` as viewer on a free loopback port with a
// token of its own, waits until the page's stream shows want nodes, and
// returns the page's URL and the process.
func startUI(ctx context.Context, dir string, o options, viewer *localcluster.Identity, pubFile string, want int) (string, *localcluster.Process, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", nil, err
	}
	token := hex.EncodeToString(b)
	tokenFile := filepath.Join(dir, "ui-token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return "", nil, err
	}
	addr := metricsAddr()
	p, err := localcluster.StartProcess(filepath.Join(dir, "kubegpu-ui.log"), filepath.Join(o.binDir, "kubegpu"), "ui",
		"--kubeconfig", viewer.Kubeconfig, "--allocation-key", pubFile, "--listen", addr, "--token-file", tokenFile)
	if err != nil {
		return "", nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		nodes, err := uiNodes(ctx, "http://"+addr, token)
		if err == nil && nodes >= want {
			fmt.Printf("    the page shows %d nodes (log: %s)\n", nodes, p.Log)
			return "http://" + addr + "/?token=" + token, p, nil
		}
		if time.Now().After(deadline) {
			_ = p.Stop()
			return "", nil, fmt.Errorf("kubegpu ui did not show %d nodes within a minute (see %s): %w", want, p.Log, err)
		}
		select {
		case <-ctx.Done():
			_ = p.Stop()
			return "", nil, ctx.Err()
		case <-time.After(250 * time.Millisecond): // the poll's step
		}
	}
}

// uiNodes reads the first update of the page's stream and counts its
// nodes.
func uiNodes(ctx context.Context, base, token string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/events", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /api/events: %s", resp.Status)
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 16<<20)
	for lines.Scan() {
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			var u struct {
				Order []string `json:"order"`
			}
			if err := json.Unmarshal([]byte(data), &u); err != nil {
				return 0, err
			}
			return len(u.Order), nil
		}
	}
	if err := lines.Err(); err != nil {
		return 0, fmt.Errorf("the stream ended: %w", err)
	}
	return 0, errors.New("the stream ended before its first update")
}
