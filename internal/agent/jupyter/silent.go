package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
)

// RunSilent runs code as a silent execute_request (no output, no history,
// no execution count) and waits for its reply: for plumbing such as warming
// a spare kernel up before anyone uses it. It fails with ErrBusy while an
// Execute runs, ErrDead or ErrClosed without a kernel, ctx.Err() when ctx
// ends first (the code keeps running in the kernel), and an error naming the
// exception when the code raised one.
func (k *Kernel) RunSilent(ctx context.Context, code string) error {
	if !k.busy.CompareAndSwap(false, true) {
		return ErrBusy
	}
	defer k.busy.Store(false)
	in, err := k.current()
	if err != nil {
		return err
	}
	return in.runSilent(ctx, code)
}

// runSilent is RunSilent on in, for a caller that holds the kernel.
func (in *instance) runSilent(ctx context.Context, code string) error {
	reply := make(chan errorContent, 1)
	id, err := in.send(in.shell, "execute_request", executeRequest{
		Code: code, Silent: true, UserExpressions: map[string]any{},
	}, func(ch string, m *message) {
		if ch != "shell" || m.Header.MsgType != "execute_reply" {
			return
		}
		var c errorContent
		json.Unmarshal(m.Content, &c)
		select {
		case reply <- c:
		default:
		}
	})
	if err != nil {
		return err
	}
	defer in.forget(id)
	select {
	case c := <-reply:
		if c.Status != "ok" {
			return fmt.Errorf("%s: %s: %s", c.Status, c.Ename, c.Evalue)
		}
		return nil
	case <-in.proc.Done():
		return fmt.Errorf("%w (%s)", ErrDead, in.deathReason())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// QueueSilent sends code as a silent execute_request and returns without
// waiting for it: the kernel runs shell requests in order, so the code runs
// before any cell sent after it. A failure of the code is only logged. It
// returns ErrDead or ErrClosed without a kernel.
func (k *Kernel) QueueSilent(code string) error {
	in, err := k.current()
	if err != nil {
		return err
	}
	in.sendSilent(code)
	return nil
}

// EnvSetCode is the code that sets env in the kernel for good (its
// Options.EnvCode's set part, whose saved values only a run's restore
// would use); "" for a kernel without EnvCode.
func (k *Kernel) EnvSetCode(env map[string]string) string {
	if k.opts.EnvCode == nil || checkEnv(env) != nil {
		return ""
	}
	set, _ := k.opts.EnvCode(env)
	return set
}
