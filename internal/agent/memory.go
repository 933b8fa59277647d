package agent

import "log/slog"

// memLimit is what the memory watch holds kernels to, in bytes.
type memLimit struct {
	total     int64 // the sandbox's memory (MemTotal)
	perKernel int64 // a kernel's resident memory past this: killed
	pressure  int64 // the sandbox's use past this: its largest kernel killed
	// margin is how far past those a kernel may map memory before the
	// watch's next look (see asCap).
	margin int64
}

// memLimits derives the limits from the sandbox's memory: a kernel may use
// all but a reserve of a quarter (at least 192 MiB), and the sandbox all
// but half that reserve; the margin is a quarter of the reserve. Sandboxes
// too small for such a reserve get none.
func memLimits(total int64) (memLimit, bool) {
	reserve := max(total/4, 192<<20)
	if total < 2*reserve {
		return memLimit{}, false
	}
	return memLimit{total: total, perKernel: total - reserve, pressure: total - reserve/2, margin: reserve / 4}, true
}

// asCap is the address-space limit (RLIMIT_AS) the watch gives a kernel of
// vsz bytes mapped and rss resident, with used bytes in use in the whole
// sandbox, until its next look; 0 for none. The watch polls, and a kernel
// allocating faster than it looks (a busy host starves the watch, not
// always the cell) could take the sandbox past the host's limit, which
// kills every context. With the limit, a kernel can map no more than its
// room: what keeps it and the sandbox within their limits plus the
// margin. Its allocations then fail (Python's MemoryError) instead, and
// the watch's next look kills it. Only a kernel holding half its own limit
// gets one: mapped memory is not all resident (thread stacks, the
// reservations of libraries: a kernel importing numpy maps some 2 GB and
// holds 150 MB), so a limit on a kernel starting up, or on every kernel of
// a busy sandbox, would fail allocations that fit. Memory mapped earlier
// but touched only later escapes the limit; it backs the watch up, it does
// not replace it.
func (l memLimit) asCap(vsz, rss, used int64) int64 {
	if rss < l.perKernel/2 {
		return 0
	}
	room := min(l.perKernel+l.margin-rss, l.pressure+l.margin-used)
	return vsz + max(room, 0)
}

// memWatch is what the memory watch runs with, for the kernels' own
// checks (KillIfOverMemory).
type memWatch struct {
	limit memLimit
	log   *slog.Logger
}
