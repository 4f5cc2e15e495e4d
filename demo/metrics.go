package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kubegpu/kubegpu/internal/localcluster"
)

// metricsAddr is a free loopback address for a shim's metrics.
func metricsAddr() string {
	port, err := localcluster.FreePort()
	if err != nil {
		return "127.0.0.1:0"
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// showMetrics scrapes kubegpu-scheduler's /metrics as viewer (bound to
// kubegpu-metrics-reader) and each shim's, prints how many kubegpu series
// each serves, and the commands that scrape them. The viewer's
// certificate and key are written to dir/identities for those commands.
func showMetrics(ctx context.Context, dir string, viewer *localcluster.Identity, schedulerPort int, shims map[string]string) error {
	certFile := filepath.Join(dir, "identities", demoViewer+".crt")
	keyFile := filepath.Join(dir, "identities", demoViewer+".key")
	if err := os.WriteFile(certFile, viewer.Config.CertData, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, viewer.Config.KeyData, 0o600); err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(viewer.Config.CertData, viewer.Config.KeyData)
	if err != nil {
		return err
	}
	// kube-scheduler serves /metrics with a certificate it made itself.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed
	url := fmt.Sprintf("https://127.0.0.1:%d/metrics", schedulerPort)
	n, err := countSeries(ctx, client, url)
	if err != nil {
		return fmt.Errorf("kubegpu-scheduler's metrics as %s: %w", demoViewer, err)
	}
	fmt.Printf("    kubegpu-scheduler: %d kubegpu_ series\n      curl -sk --cert %s --key %s %s\n", n, certFile, keyFile, url)
	nodes := make([]string, 0, len(shims))
	for node := range shims {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		url := "http://" + shims[node] + "/metrics"
		n, err := countSeries(ctx, http.DefaultClient, url)
		if err != nil {
			return fmt.Errorf("the metrics of %s's shim: %w", node, err)
		}
		fmt.Printf("    kubegpu-crishim on %-10s %d kubegpu_ series: curl -s %s\n", node+":", n, url)
	}
	return nil
}

// countSeries gets url and counts its kubegpu_ samples.
func countSeries(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	n := 0
	for sc := bufio.NewScanner(bytes.NewReader(body)); sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "kubegpu_") {
			n++
		}
	}
	return n, nil
}
