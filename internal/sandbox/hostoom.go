package sandbox

import (
	"bytes"
	"strings"
	"sync"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// The agent's memory watch kills a process tree filling the sandbox and
// writes why last on its stderr. A tree growing faster than the watch
// looks (a loop allocating over a GiB a second, on a busy host), or one in
// a sandbox too small to have a watch, can reach the host's limit first:
// the host's out-of-memory killer then kills one of the sandbox's tasks
// with SIGKILL and no word. The AgentClient tells the two apart by the
// runtime's count of host kills (pandastack.RuntimeOOMKills) and writes
// the word itself.

// agentOOMNote starts the agent's own note (agent.oomNote).
var agentOOMNote = []byte("pandastack: out_of_memory: ")

// hostKillNote is the note on the stderr of a command of kind what ("command",
// "background process") that the host's out-of-memory killer killed.
func hostKillNote(what string) []byte {
	return []byte("\npandastack: out_of_memory: the sandbox reached its host memory limit, and the host's out-of-memory killer killed this " + what + "\n")
}

// oomKills is the runtime's count of host out-of-memory kills in the
// sandbox, or -1 when it cannot tell.
func (c *AgentClient) oomKills() int64 {
	if c.hostOOMKills == nil {
		return -1
	}
	return c.hostOOMKills()
}

// killedBySIGKILL reports whether exit event ev says its command died of
// SIGKILL: by the signal, or by bash's exit status for a child killed so
// (137), as a compound command (cd x && python f.py) ends.
func killedBySIGKILL(ev agentproto.ExecEvent) bool {
	return ev.Signal == "SIGKILL" || ev.Signal == "" && ev.ExitCode == 128+9
}

// hostKilled reports whether a command of events up to exit ev (told: the
// agent's own note was among them), started when the host's count of
// kills was before, was killed by the host: it died of SIGKILL, not by a
// timeout, with no word of the agent's, and the count went up since. A
// count that went up for another task the host killed meanwhile while
// this one died of a kill -9 from within counts too: the host kills only
// when the whole sandbox is out of memory, so the note is true of the
// sandbox if not of this command.
func hostKilled(ev agentproto.ExecEvent, told bool, before int64, count func() int64) bool {
	return before >= 0 && killedBySIGKILL(ev) && !ev.TimedOut && !told && count() > before
}

// explainHostKills wraps onEvent, the events of a command of kind what
// that started when the host's count of kills was before: the exit of one
// the host killed (hostKilled) comes after the host's note on stderr.
func explainHostKills(what string, before int64, count func() int64, onEvent func(agentproto.ExecEvent) error) func(agentproto.ExecEvent) error {
	if before < 0 {
		return onEvent
	}
	return withHostNote(what, onEvent, func(ev agentproto.ExecEvent, told bool) bool {
		return hostKilled(ev, told, before, count)
	})
}

// withHostNote wraps onEvent, the events of a command of kind what: its
// exit comes after the host's note on stderr when killed, given the exit
// and whether the agent's own note came before, says the host killed it.
func withHostNote(what string, onEvent func(agentproto.ExecEvent) error, killed func(ev agentproto.ExecEvent, told bool) bool) func(agentproto.ExecEvent) error {
	told := false
	return func(ev agentproto.ExecEvent) error {
		switch {
		case ev.Type == "stderr" && bytes.Contains(ev.Data, agentOOMNote):
			told = true
		case ev.Type == "exit" && killed(ev, told):
			if err := onEvent(agentproto.ExecEvent{Type: "stderr", Data: hostKillNote(what)}); err != nil {
				return err
			}
		}
		return onEvent(ev)
	}
}

// explainHostKernelKill adds the host's word to the KernelDied error of a
// run that started when the host's count of kills was before, when the
// kernel died of SIGKILL, the count went up since, and the agent named no
// reason of its own.
func explainHostKernelKill(ex *agentproto.Execution, before int64, count func() int64) {
	if before < 0 || ex.Error == nil || ex.Error.Name != "KernelDied" || !strings.Contains(ex.Error.Value, "SIGKILL") || strings.Contains(ex.Error.Value, "out_of_memory") || count() <= before {
		return
	}
	ex.Error.Value += "; out_of_memory: the sandbox reached its host memory limit, and the host's out-of-memory killer killed the kernel"
}

// procKills keeps, per background process this client started
// (AgentClient.StartProcess), the host's count of kills when it started,
// and once a read of its output saw it exit, whether the host killed it:
// every later read says the same. A process killed through the API
// (KillProcess, KillAll) is forgotten, so its SIGKILL is not the host's.
type procKills struct {
	mu sync.Mutex
	m  map[int]procKill
}

type procKill struct {
	before  int64
	decided bool
	host    bool
}

// maxProcKills bounds procKills: past it, every count kept goes (the
// output of those processes, read later, gets no host note).
const maxProcKills = 4096

func (p *procKills) start(pid int, before int64) {
	if before < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil || len(p.m) >= maxProcKills {
		p.m = make(map[int]procKill)
	}
	p.m[pid] = procKill{before: before}
}

// forget drops pid's count, or every count with pid 0.
func (p *procKills) forget(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pid == 0 {
		p.m = nil
	} else {
		delete(p.m, pid)
	}
}

// explain wraps onEvent, the output events of background process pid,
// as explainHostKills does, deciding at the first exit a read sees.
// Decided then, not at the exit itself: a first read long after the exit
// counts the host's kills until that read.
func (p *procKills) explain(pid int, count func() int64, onEvent func(agentproto.ExecEvent) error) func(agentproto.ExecEvent) error {
	p.mu.Lock()
	_, ok := p.m[pid]
	p.mu.Unlock()
	if !ok {
		return onEvent
	}
	return withHostNote("background process", onEvent, func(ev agentproto.ExecEvent, told bool) bool {
		return p.decide(pid, ev, told, count)
	})
}

// decide is whether the host killed pid, which exited with ev, decided
// the first time and kept.
func (p *procKills) decide(pid int, ev agentproto.ExecEvent, told bool, count func() int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.m[pid]
	if !ok { // killed through the API meanwhile
		return false
	}
	if !k.decided {
		k.decided, k.host = true, hostKilled(ev, told, k.before, count)
		p.m[pid] = k
	}
	return k.host
}
