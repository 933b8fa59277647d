//go:build !linux

package agent

import (
	"context"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

type watcher struct{}

func newWatcher(fileTarget, bool, *uploadTemps) (*watcher, error) {
	return nil, pandastack.Errorf(pandastack.EInvalid, "watching a directory needs Linux (inotify)")
}

func (*watcher) close() {}

func (*watcher) run(context.Context, func([]agentproto.FileEvent) error) error { return nil }
