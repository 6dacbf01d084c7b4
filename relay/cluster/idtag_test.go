package cluster

import (
	"testing"

	"github.com/greyrelay/greyrelay/queue"
)

func TestIDTag(t *testing.T) {
	seen := map[uint32]string{}
	for _, name := range []string{"node-127.0.0.11", "node-127.0.0.12", "node-127.0.0.13", "relay1", "relay2", "", "a"} {
		tag := IDTag(name)
		if tag == 0 || tag >= 1<<queue.NodeBits {
			t.Errorf("IDTag(%q) = %#x: want 1 .. 2^%d-1", name, tag, queue.NodeBits)
		}
		if IDTag(name) != tag {
			t.Errorf("IDTag(%q) changes between calls", name)
		}
		if other, ok := seen[tag]; ok {
			t.Errorf("IDTag(%q) = IDTag(%q) = %#x", name, other, tag)
		}
		seen[tag] = name
	}
	// Two names whose 24-bit hashes meet (cmd/greyrelay's cluster status
	// test reports them): the tags are equal, as the hash says.
	if a, b := IDTag("relay11859"), IDTag("relay27924"); a != b || a != 0x22a192 {
		t.Errorf("IDTag(relay11859) = %#x, IDTag(relay27924) = %#x; want both 0x22a192", a, b)
	}
}
