package plugin

import (
	"testing"

	fwk "k8s.io/kube-scheduler/framework"
)

func TestNormalizeByRank(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []int64
		want []int64
	}{
		{"one", []int64{5}, []int64{100}},
		{"ties stay tied", []int64{7, 7, 3}, []int64{100, 100, 99}},
		{"order kept", []int64{1 << 40, -5, 1<<40 + 1, 0}, []int64{99, 0, 100, 50}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var scores fwk.NodeScoreList
			for i, s := range tt.in {
				scores = append(scores, fwk.NodeScore{Name: string(rune('a' + i)), Score: s})
			}
			normalizeByRank(scores)
			for i := range scores {
				if scores[i].Score != tt.want[i] {
					t.Errorf("scores %v normalised to %v, want %v", tt.in, scores, tt.want)
					break
				}
			}
		})
	}
	// Many nodes: the best one alone gets the maximum, all stay in range.
	var scores fwk.NodeScoreList
	for i := 0; i < 1000; i++ {
		scores = append(scores, fwk.NodeScore{Score: int64(i)})
	}
	normalizeByRank(scores)
	for i, s := range scores {
		if s.Score < 0 || s.Score > fwk.MaxScore || (s.Score == fwk.MaxScore) != (i == 999) || (i > 0 && s.Score < scores[i-1].Score) {
			t.Fatalf("node %d of 1000 normalised to %d", i, s.Score)
		}
	}
}

func TestNormalizeHostOnly(t *testing.T) {
	scores := fwk.NodeScoreList{{Name: "gpu-busy", Score: -3}, {Name: "cpu-a", Score: noDevices}, {Name: "gpu-idle", Score: -90}, {Name: "cpu-b", Score: noDevices}, {Name: "gpu-full", Score: 0}}
	normalizeHostOnly(scores)
	want := map[string]int64{"cpu-a": 100, "cpu-b": 100, "gpu-full": 50, "gpu-busy": 49, "gpu-idle": 0}
	for _, s := range scores {
		if s.Score != want[s.Name] {
			t.Errorf("normalised %v, want %v", scores, want)
			break
		}
	}
}
