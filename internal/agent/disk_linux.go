package agent

import (
	"fmt"
	"syscall"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// diskUse is statfs of dir: its filesystem's size, and what is used of it
// (by anyone: root's reserve counts as used, as df counts it).
func diskUse(dir string) (agentproto.Disk, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return agentproto.Disk{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := int64(st.Bsize)
	return agentproto.Disk{SizeBytes: int64(st.Blocks) * bs, UsedBytes: int64(st.Blocks-st.Bfree) * bs}, nil
}
