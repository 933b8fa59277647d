package agent

import (
	"fmt"
	"sync"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// A sandbox's hostname is its id's (agentproto.Hostname). gVisor names a
// restored sandbox after the container it is restored into, unless a
// process in it set its name itself (then it keeps the image's); a
// suspended sandbox may be resumed into a container created ahead under
// another id. So every hello sets the name when it finds another
// (agentproto.FeatureHostname). The hello comes before any command, cell
// or file request after a restore; processes that were running when the
// image was taken (a server started from a cell) run on from the restore
// and may read the name before the hello has set it.

// hostnameOps reads and sets the system's hostname (a test's fakes).
type hostnameOps struct {
	get func() (string, error)
	set func(string) error
}

// ensure sets the hostname of sandbox id unless it is that already.
func (h hostnameOps) ensure(id string) error {
	want := agentproto.Hostname(id)
	if cur, err := h.get(); err == nil && cur == want {
		return nil
	}
	if err := h.set(want); err != nil {
		return fmt.Errorf("set the hostname to %s: %w", want, err)
	}
	return nil
}

// setsHostname is canSetHostname, asked once.
var setsHostname = sync.OnceValue(canSetHostname)
