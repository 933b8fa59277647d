package main

import (
	"context"
	"fmt"
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
// same sandbox paused on request, then POST resume and the same run_code.
func (b *bench) idleResume(ctx context.Context) error {
	s := b.pool
	one := int64(1)
	sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: ciTemplate, TTLSeconds: sandboxTTL, IdleTimeoutSeconds: &one})
	if err != nil {
		return err
	}
	s.track(sb.ID)
	defer s.kill(sb.ID)
	var idle, manual []float64
	for r := range b.set.N {
		want := fmt.Sprint(r)
		if err := expectText(ctx, s.c, sb.ID, "x = "+want+"\nx", want); err != nil {
			return err
		}
		if r%2 == 0 {
			if err := waitSuspended(ctx, s.c, sb.ID); err != nil {
				return err
			}
			t0 := time.Now()
			if err := expectText(ctx, s.c, sb.ID, "x", want); err != nil {
				return fmt.Errorf("after an idle suspend: %w", err)
			}
			idle = append(idle, ms(time.Since(t0)))
			continue
		}
		// The sandbox may be suspending itself already; pause answers
		// conflict then, and the idle suspend does the job instead.
		if _, err := s.c.Pause(ctx, sb.ID); err != nil && !client.IsCode(err, "conflict") {
			return err
		}
		if err := waitState(ctx, s.c, sb.ID, "paused"); err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := s.c.Resume(ctx, sb.ID); err != nil {
			return err
		}
		if err := expectText(ctx, s.c, sb.ID, "x", want); err != nil {
			return fmt.Errorf("after a pause: %w", err)
		}
		manual = append(manual, ms(time.Since(t0)))
	}
	b.add(summarize("idle", "resume of an idle-suspended sandbox → first result", "ms", idle,
		"code-interpreter with idle_timeout_seconds 1; from the run_code that resumes it to its result (the variable set before the suspend)").
		withTarget(targetIdleResumeP50, targetIdleResumeP95, "issue 13"))
	b.add(summarize("idle", "baseline: paused on request, POST resume + first result", "ms", manual,
		"the same sandbox, alternating with the idle rounds"))
	return nil
}

// waitSuspended waits until the server suspended the sandbox for idleness.
func waitSuspended(ctx context.Context, c *client.Client, id string) error {
	return waitFor(ctx, c, id, "suspended for idleness", func(sb *client.Sandbox) bool { return sb.State == "paused" && sb.PauseReason == "idle" })
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
