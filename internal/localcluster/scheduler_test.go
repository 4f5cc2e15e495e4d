package localcluster

import (
	"strings"
	"testing"
)

func TestShippedSchedulerConfig(t *testing.T) {
	c := &Cluster{}
	for _, path := range []string{"../../kube-scheduler/config/kubegpu-scheduler.yaml", "../../kube-scheduler/config/second-scheduler.yaml"} {
		got, err := c.ShippedSchedulerConfig(path, "/tmp/kc", "/plugins", "/key.pem", 300, "heartbeatStaleness: 1h", "writeAllocation: PreBind")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"kubeconfig: /tmp/kc\n", "  qps: 300\n", "leaderElect: false", "pluginDir: /plugins", "signingKeyFile: /key.pem",
			"heartbeatStaleness: 1h", "writeAllocation: PreBind"} {
			if strings.Count(got, want) != 1 {
				t.Errorf("%s: %q appears %d times, want once:\n%s", path, want, strings.Count(got, want), got)
			}
		}
		if strings.Contains(got, "heartbeatStaleness: 40s") {
			t.Errorf("%s: the shipped heartbeatStaleness was not replaced", path)
		}
	}
}
