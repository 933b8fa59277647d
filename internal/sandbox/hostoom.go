package sandbox

import (
	"bytes"
	"strings"
	"sync"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// The agent's memory watch kills a process tree filling the sandbox and
// writes why last on its stderr. A tree growing faster than the watch
// looks (a loop allocating over a GiB a second, on a busy host) can reach
// the host's limit first: the host's out-of-memory killer then kills it
// with SIGKILL and no word. The manager tells the two apart by the
// runtime's count of host kills (pandastack.RuntimeOOMKills) and writes
// the word itself.

// agentOOMNote starts the agent's own note (agent.oomNote).
var agentOOMNote = []byte("pandastack: out_of_memory: ")

// hostKillNote is the note on the stderr of a command of kind what ("command",
// "background process") that the host's out-of-memory killer killed.
func hostKillNote(what string) []byte {
	return []byte("\npandastack: out_of_memory: the sandbox ran out of memory before its memory watch could act, and the host killed this " + what + "\n")
}

// oomKills is the runtime's count of host out-of-memory kills in the
// sandbox, or -1 when it cannot tell.
func (c *AgentClient) oomKills() int64 {
	if c.hostOOMKills == nil {
		return -1
	}
	return c.hostOOMKills()
}

// explainHostKills wraps onEvent, the events of a command of kind what
// that started when the host's count of kills was before: an exit by
// SIGKILL the agent gave no reason for, with the count gone up since,
// comes after the host's note on stderr. A count that went up for
// another process killed meanwhile while this one was killed by SIGKILL
// from within (kill -9) would get the note too: the host kills only when
// the whole sandbox is out of memory, so the note is true of the sandbox.
func explainHostKills(what string, before int64, count func() int64, onEvent func(agentproto.ExecEvent) error) func(agentproto.ExecEvent) error {
	if before < 0 {
		return onEvent
	}
	told := false
	return func(ev agentproto.ExecEvent) error {
		switch {
		case ev.Type == "stderr" && bytes.Contains(ev.Data, agentOOMNote):
			told = true
		case ev.Type == "exit" && ev.Signal == "SIGKILL" && !ev.TimedOut && !told && count() > before:
			told = true
			if err := onEvent(agentproto.ExecEvent{Type: "stderr", Data: hostKillNote(what)}); err != nil {
				return err
			}
		}
		return onEvent(ev)
	}
}

// explainHostKernelKill adds the host's word to the KernelDied error of a
// run that started when the host's count of kills was before, when the
// count went up since and the agent named no reason of its own.
func explainHostKernelKill(ex *agentproto.Execution, before int64, count func() int64) {
	if before < 0 || ex.Error == nil || ex.Error.Name != "KernelDied" || strings.Contains(ex.Error.Value, "out_of_memory") || count() <= before {
		return
	}
	ex.Error.Value += "; out_of_memory: the sandbox ran out of memory before its memory watch could act, and the host killed the kernel"
}

// procKills keeps, per background process, the host's count of kills when
// it started (AgentClient.StartProcess), for the note on its output.
type procKills struct {
	mu sync.Mutex
	m  map[int]int64
}

// maxProcKills bounds procKills: past it, the counts of older processes go
// (their output, read later, gets no host note).
const maxProcKills = 4096

func (p *procKills) set(pid int, n int64) {
	if n < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || len(p.m) >= maxProcKills {
		p.m = make(map[int]int64)
	}
	p.m[pid] = n
}

func (p *procKills) get(pid int) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.m[pid]; ok {
		return n
	}
	return -1
}
