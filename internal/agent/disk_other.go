//go:build !linux

package agent

import (
	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

func diskUse(string) (agentproto.Disk, error) {
	return agentproto.Disk{}, pandastack.Errorf(pandastack.EUnavailable, "disk use is measured on Linux only")
}
