package plugin

import (
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFilterScoresSlots: scores put from many goroutines at once (as the
// framework's parallel Filter calls put them) are all read back; of two
// scores of one node, the later counts (the framework's second pass over a
// node with nominated pods); once a score is dropped beyond the slots a
// cycle may fill, none is read, so that Score evaluates every node.
func TestFilterScoresSlots(t *testing.T) {
	const nodes = 100
	objs := make([]*corev1.Node, nodes)
	for i := range objs {
		objs[i] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("n", i)}}
	}
	var f filterScores
	f.reset(nodes)
	if f.buf.Load() != nil {
		t.Fatal("buffers taken before a score was put")
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < nodes; i += 16 {
				f.put(objs[i], int64(i))
			}
		})
	}
	wg.Wait()
	f.put(objs[7], 1000) // a second pass over node 7
	f.index()
	for i, n := range objs {
		want := int64(i)
		if i == 7 {
			want = 1000
		}
		if got, ok := f.get(n); !ok || got != want {
			t.Errorf("node %d: score %d, %v; want %d", i, got, ok, want)
		}
	}
	f.release()
	if _, ok := f.get(objs[0]); ok {
		t.Error("a score read after release")
	}

	var g filterScores
	g.reset(1) // room for 2*1+2 scores
	for i := range 6 {
		g.put(objs[i], int64(i))
	}
	g.index()
	for i := range 6 {
		if _, ok := g.get(objs[i]); ok {
			t.Errorf("overflow: node %d's score read; want none (Score evaluates every node)", i)
		}
	}
	if d := g.release(); d != 2 {
		t.Errorf("dropped %d scores, want 2", d)
	}
}
