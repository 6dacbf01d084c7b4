package queue

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestNextID(t *testing.T) {
	const tag = 0xabcdef
	tests := []struct {
		name string
		last uint64
		node uint32
		want ID
	}{
		{"no tag counts on", 41, 0, 42},
		{"first tagged ID of a fresh queue", 0, tag, 1<<NodeBits | tag},
		{"tagged after tagged", 7<<NodeBits | tag, tag, 8<<NodeBits | tag},
		{"tagged after plain counts", 2, tag, 1<<NodeBits | tag},
		{"plain counts past the tag's width", 1<<NodeBits + 5, tag, 2<<NodeBits | tag},
		{"another node's tag (a moved queue)", 7<<NodeBits | 0x123456, tag, 8<<NodeBits | tag},
		{"a tag wider than NodeBits is cut", 0, 1<<NodeBits | 5, 1<<NodeBits | 5},
		{"a tag whose low bits are zero is no tag", 9, 1 << NodeBits, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nextID(tt.last, tt.node)
			if got != tt.want {
				t.Errorf("nextID(%#x, %#x) = %s, want %s", tt.last, tt.node, got, tt.want)
			}
			if uint64(got) <= tt.last {
				t.Errorf("nextID(%#x, %#x) = %s does not grow", tt.last, tt.node, got)
			}
		})
	}
}

// TestPlainIDsStayValid opens a queue written before IDs named their
// node: testdata/plainids.db was written by greyrelay 9527c75 with
// queue.Open(path, Options{JournalSize: -1}) and two Enqueue calls
// (IDs 1 and 2; a@one.test and b@two.test, then c@one.test). Opened with a
// node tag, its messages are shown and acted on by their old IDs, and new
// messages get tagged IDs above them, also after the queue moves to a
// node with another tag.
func TestPlainIDsStayValid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.db")
	b, err := os.ReadFile("testdata/plainids.db")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	open := func(node uint32) *Queue {
		q, err := Open(path, Options{Node: node})
		if err != nil {
			t.Fatalf("opening the queue with plain IDs: %v", err)
		}
		return q
	}
	q := open(0xabcdef)
	for id, want := range map[ID][]string{1: {"a@one.test", "b@two.test"}, 2: {"c@one.test"}} {
		m, err := q.Show(id)
		if err != nil {
			t.Fatalf("Show(%s): %v", id, err)
		}
		var got []string
		for _, r := range m.Recipients {
			got = append(got, r.Addr)
		}
		if m.ID != id || !slices.Equal(got, want) {
			t.Errorf("Show(%s): message %s to %v, want %v", id, m.ID, got, want)
		}
	}
	if n, err := q.Hold(Selector{ID: 1}); err != nil || n != 2 {
		t.Errorf("Hold(ID 1): %d, %v; want its 2 recipients", n, err)
	}
	if n, err := q.Delete(Selector{ID: 2}); err != nil || n != 1 {
		t.Errorf("Delete(ID 2): %d, %v; want its recipient", n, err)
	}
	enqueue := func() ID {
		id, err := q.Enqueue(NewMessage{From: "s@src.test", Arrival: time.Now(),
			To: []NewRecipient{{Addr: "d@one.test", Domain: "one.test"}}, Body: []byte("Subject: new\r\n\r\nx\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if id := enqueue(); id != 1<<NodeBits|0xabcdef {
		t.Errorf("the first new ID is %s, want %s (count 1, tag abcdef)", id, ID(1<<NodeBits|0xabcdef))
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = open(0x123456) // the queue moved to another node
	defer q.Close()
	if id := enqueue(); id != 2<<NodeBits|0x123456 {
		t.Errorf("the next ID on another node is %s, want %s", id, ID(2<<NodeBits|0x123456))
	}
	if m, err := q.Show(1); err != nil || len(m.Recipients) != 2 || m.Recipients[0].Status != Held {
		t.Errorf("Show(1) after the move: %+v, %v; want its 2 held recipients", m, err)
	}
}
