package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
)

// View is one state of what the page shows: its nodes, each by name, and
// the rest (totals, pending pods, quotas, notes) as one summary. Both are
// marshalled to JSON as they are.
type View struct {
	Nodes   []NamedNode
	Summary any
}

// NamedNode is one node of a View: Name identifies it between views, Data
// is what the page shows of it.
type NamedNode struct {
	Name string
	Data any
}

// state is the latest view as JSON: each node's part apart, so a page is
// sent only the nodes that changed.
type state struct {
	version int64
	// published is when it was published, in Unix milliseconds: the page
	// measures how long an update took to show.
	published int64
	order     []string
	nodes     map[string]json.RawMessage
	summary   json.RawMessage
}

// board holds the latest state and wakes the streams when it changes.
type board struct {
	mu      sync.Mutex
	cur     *state
	changed chan struct{} // closed and replaced on each change
}

func newBoard() *board { return &board{changed: make(chan struct{})} }

// publish makes v the latest state.
func (b *board) publish(v View) error {
	st := &state{nodes: make(map[string]json.RawMessage, len(v.Nodes)), published: time.Now().UnixMilli()}
	for _, n := range v.Nodes {
		if _, dup := st.nodes[n.Name]; dup {
			return fmt.Errorf("node %q is in the view twice", n.Name)
		}
		raw, err := json.Marshal(n.Data)
		if err != nil {
			return fmt.Errorf("node %q: %w", n.Name, err)
		}
		st.order = append(st.order, n.Name)
		st.nodes[n.Name] = raw
	}
	raw, err := json.Marshal(v.Summary)
	if err != nil {
		return fmt.Errorf("summary: %w", err)
	}
	st.summary = raw
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil {
		st.version = b.cur.version + 1
	} else {
		st.version = 1
	}
	b.cur = st
	close(b.changed)
	b.changed = make(chan struct{})
	return nil
}

// latest is the latest state (nil before the first) and a channel closed
// when a newer one is published.
func (b *board) latest() (*state, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur, b.changed
}

// update is one message of the stream: the whole view (Full) or what
// changed since the page's last one. Nodes are in the view's order; Order
// is sent when the set of nodes or their order changed.
type update struct {
	Version   int64             `json:"version"`
	Published int64             `json:"published"`
	Full      bool              `json:"full,omitempty"`
	Order     []string          `json:"order,omitempty"`
	Nodes     []json.RawMessage `json:"nodes,omitempty"`
	Removed   []string          `json:"removed,omitempty"`
	Summary   json.RawMessage   `json:"summary,omitempty"`
}

// seen is what one page was last sent.
type seen struct {
	order   []string
	nodes   map[string]json.RawMessage
	summary json.RawMessage
}

// diff is the update that brings a page that was sent s to cur, and
// records cur as sent.
func (s *seen) diff(cur *state) update {
	u := update{Version: cur.version, Published: cur.published}
	if s.nodes == nil {
		u.Full = true
		u.Order = cur.order
		for _, name := range cur.order {
			u.Nodes = append(u.Nodes, cur.nodes[name])
		}
		u.Summary = cur.summary
	} else {
		if !slices.Equal(s.order, cur.order) {
			u.Order = cur.order
		}
		for _, name := range cur.order {
			if old, ok := s.nodes[name]; !ok || !bytes.Equal(old, cur.nodes[name]) {
				u.Nodes = append(u.Nodes, cur.nodes[name])
			}
		}
		for _, name := range s.order {
			if _, ok := cur.nodes[name]; !ok {
				u.Removed = append(u.Removed, name)
			}
		}
		if !bytes.Equal(s.summary, cur.summary) {
			u.Summary = cur.summary
		}
	}
	// The state is never changed once published: keeping its parts is
	// keeping what was sent.
	s.order, s.nodes, s.summary = cur.order, cur.nodes, cur.summary
	return u
}

// empty reports whether u changes nothing.
func (u update) empty() bool {
	return !u.Full && u.Order == nil && len(u.Nodes) == 0 && len(u.Removed) == 0 && u.Summary == nil
}
