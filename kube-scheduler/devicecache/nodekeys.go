package devicecache

import (
	"errors"
	"fmt"

	"github.com/kubegpu/kubegpu/types"
)

// ErrKeyRefused is why a node whose shim does not accept the scheduler's
// signing key gets no GPU pods: their containers would be refused their
// allocations there, pod after pod.
var ErrKeyRefused = errors.New("node's kubegpu-crishim does not accept this scheduler's signing key")

// keyRefusal says why node inventory inv refuses allocations signed with
// the key of ID signing ("ALGORITHM:KEYID"), or returns nil. The message
// is the same for every such node (Filter's statuses are counted by
// message) and holds nothing the node wrote.
func keyRefusal(inv types.Inventory, signing string) error {
	if signing == "" || inv.AcceptsKey(signing) {
		return nil
	}
	return fmt.Errorf("%w (%s): give the node the scheduler's public key (kubegpu-crishim --allocation-key)", ErrKeyRefused, signing)
}
