package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// Target of issue 13 (idle suspend).
const (
	targetIdleResumeP50 = 250
	targetIdleResumeP95 = 400
)

// idleResume measures the first answer of a sandbox the server suspended
// for idleness: from the run_code request that resumes it until its result,
// with the variable set before the suspend. Side by side, alternating: the
// same sandbox paused on request, then POST resume and the same run_code;
// with -baseline, the same idle rounds on the other revision's server too.
// The server's own timing of each resume's steps ("sandbox resumed" in its
// log) gives the breakdown.
func (b *bench) idleResume(ctx context.Context) error {
	type side struct {
		name         string
		s            *server
		id           string
		idle, manual []float64
		logFrom      int
	}
	sides := []*side{{name: "", s: b.pool}}
	if b.baseline != nil {
		sides = append(sides, &side{name: "baseline (-baseline): ", s: b.baseline})
	}
	servers := make([]*server, len(sides))
	for i, sd := range sides {
		servers[i], sd.logFrom = sd.s, len(sd.s.log.String())
	}
	ids, done, err := idleSandboxes(ctx, servers)
	defer done()
	if err != nil {
		return err
	}
	for i, sd := range sides {
		sd.id = ids[i]
	}
	for r := range b.set.N {
		// The sides take turns going first, so neither always follows the
		// other.
		order := slices.Clone(sides)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, sd := range order {
			s := sd.s
			want := fmt.Sprint(r)
			if err := expectText(ctx, s.c, sd.id, "x = "+want+"\nx", want); err != nil {
				return err
			}
			if r%2 == 0 || b.baseline != nil {
				if err := waitSuspended(ctx, s.c, sd.id); err != nil {
					return err
				}
				if err := waitStopped(ctx, s, sd.id); err != nil {
					return err
				}
				if err := b.gate.wait(ctx); err != nil {
					return err
				}
				t0 := time.Now()
				if err := expectText(ctx, s.c, sd.id, "x", want); err != nil {
					return fmt.Errorf("%safter an idle suspend: %w", sd.name, err)
				}
				sd.idle = append(sd.idle, ms(time.Since(t0)))
				continue
			}
			// The sandbox may be suspending itself already; pause answers
			// conflict then, and the idle suspend does the job instead.
			if _, err := s.c.Pause(ctx, sd.id); err != nil && !client.IsCode(err, "conflict") {
				return err
			}
			if err := waitState(ctx, s.c, sd.id, "paused"); err != nil {
				return err
			}
			if err := waitStopped(ctx, s, sd.id); err != nil {
				return err
			}
			if err := b.gate.wait(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			if _, err := s.c.Resume(ctx, sd.id); err != nil {
				return err
			}
			if err := expectText(ctx, s.c, sd.id, "x", want); err != nil {
				return fmt.Errorf("after a pause: %w", err)
			}
			sd.manual = append(sd.manual, ms(time.Since(t0)))
		}
	}
	for _, sd := range sides {
		st := summarize("idle", sd.name+"resume of an idle-suspended sandbox → first result", "ms", sd.idle,
			"code-interpreter with idle_timeout_seconds 1; from the run_code that resumes it to its result (the variable set before the suspend)")
		if sd.name == "" {
			st = st.withTarget(targetIdleResumeP50, targetIdleResumeP95, "issue 13")
		}
		b.add(st)
		if len(sd.manual) > 0 {
			b.add(summarize("idle", sd.name+"baseline: paused on request, POST resume + first result", "ms", sd.manual,
				"the same sandbox, alternating with the idle rounds"))
		}
		steps, order := resumeSteps(sd.s.log.String()[sd.logFrom:], sd.id)
		for _, k := range order {
			b.add(summarize("idle", sd.name+"resume step (server's timing): "+k, "ms", steps[k],
				"from the server's log line \"sandbox resumed\" of this section's resumes"))
		}
	}
	b.gate.report(b, "idle")
	return nil
}

// idleSandboxes creates on each server a code-interpreter sandbox that
// suspends itself after 1 s idle, and runs its first cell; done kills
// those made, also after an error.
func idleSandboxes(ctx context.Context, servers []*server) (ids []string, done func(), err error) {
	made := map[*server]string{}
	done = func() {
		for s, id := range made {
			s.kill(id)
		}
	}
	one := int64(1)
	for _, s := range servers {
		sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: ciTemplate, TTLSeconds: sandboxTTL, IdleTimeoutSeconds: &one})
		if err != nil {
			return nil, done, err
		}
		s.track(sb.ID)
		made[s] = sb.ID
		ids = append(ids, sb.ID)
		// A first cell at once, as a user's, on every side: it makes the
		// default context from a warm spare kernel before any suspend. A
		// side left to suspend first got a cold kernel for it after its
		// resume (the suspend releases the spares), an image of 41 MiB
		// instead of 110, and resumes about 100 ms faster: that was the
		// offset between two sides of the same build.
		if err := expectText(ctx, s.c, sb.ID, "x = -1\nx", "-1"); err != nil {
			return nil, done, err
		}
	}
	return ids, done, nil
}

var logField = regexp.MustCompile(`(\w+_ms)=([0-9.]+)`)

// resumeSteps collects the step timings of the "sandbox resumed" lines
// about sandbox id in a server's log, in the order the first line has them,
// and request_ms of the "sandbox resumed on demand" ones (the request's
// whole wait in the server until the sandbox runs).
func resumeSteps(log, id string) (map[string][]float64, []string) {
	return logSteps(log, `msg="sandbox resumed`, "sandbox="+id)
}

// logSteps collects the *_ms fields of the log lines that contain both
// msg and also, in the order the first line has them.
func logSteps(log, msg, also string) (map[string][]float64, []string) {
	steps := map[string][]float64{}
	var order []string
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, msg) || !strings.Contains(line, also) {
			continue
		}
		for _, m := range logField.FindAllStringSubmatch(line, -1) {
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				continue
			}
			if _, ok := steps[m[1]]; !ok {
				order = append(order, m[1])
			}
			steps[m[1]] = append(steps[m[1]], v)
		}
	}
	return steps, order
}

// waitSuspended waits until the server suspended the sandbox for idleness.
func waitSuspended(ctx context.Context, c *client.Client, id string) error {
	return waitFor(ctx, c, id, "suspended for idleness", func(sb *client.Sandbox) bool { return sb.State == "paused" && sb.PauseReason == "idle" })
}

// waitStopped waits until the server is done pausing the sandbox: its log
// says "sandbox paused" about it after its last "sandbox resumed". The
// server records a pause before it stops the sandbox, and an idle suspend
// then prepares its resume (--prepared-resumes: a runsc container created,
// 100-150 ms); it logs the line once both are done. A request in that
// window waits for them, which a user, whose request comes minutes after
// the suspend, does not: a resume is measured from a sandbox fully
// suspended. (Until 2026-12-04 the bench waited only until the sandbox had
// no host process or a created container, which the moment between the
// stop and the prepared resume's create also satisfies.)
func waitStopped(ctx context.Context, s *server, id string) error {
	ok, err := pollUntil(ctx, time.Minute, func() bool { return pauseDone(s.log.String(), id) })
	if err == nil && !ok {
		err = fmt.Errorf("sandbox %s: the server did not log the end of its pause within 1 min", id)
	}
	return err
}

// pauseDone reports whether the last of the "sandbox paused" and "sandbox
// resumed" lines about sandbox id in a server's log is a pause's.
func pauseDone(log, id string) bool {
	for len(log) > 0 {
		i := strings.LastIndexByte(log, '\n')
		line := log[i+1:]
		log = log[:max(i, 0)]
		if !strings.Contains(line, " sandbox="+id+" ") && !strings.HasSuffix(line, " sandbox="+id) {
			continue
		}
		switch {
		case strings.Contains(line, `msg="sandbox paused"`):
			return true
		case strings.Contains(line, `msg="sandbox resumed`):
			return false
		}
	}
	return false
}

// pollUntil checks cond every 50 ms until it holds (true), within has
// passed (false) or ctx ends (its error).
func pollUntil(ctx context.Context, within time.Duration, cond func() bool) (bool, error) {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true, nil
}

// containerStatus is the status runsc gives the sandbox's container
// ("running", "created", ...), or "" when it has none.
func containerStatus(s *server, id string) string {
	out, err := exec.Command(s.runsc, "--root="+s.runscRoot, "state", id).Output()
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	json.Unmarshal(out, &st)
	return st.Status
}

// waitState waits until the sandbox's record shows state.
func waitState(ctx context.Context, c *client.Client, id, state string) error {
	return waitFor(ctx, c, id, state, func(sb *client.Sandbox) bool { return string(sb.State) == state })
}

func waitFor(ctx context.Context, c *client.Client, id, what string, pred func(*client.Sandbox) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if pred(sb) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s was not %s within 2 min (state %s)", id, what, sb.State)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
