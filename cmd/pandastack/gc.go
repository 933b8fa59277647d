package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/template"
)

// templateGC removes the template builds and warm images that nothing of
// this data directory refers to (see sandbox.CollectRootFSRefs and
// template.GC), printing one line per build or image it removes or keeps.
func templateGC(ctx context.Context, cfg *Config, reg *template.Registry, minAge time.Duration, dryRun bool, w io.Writer) error {
	// A Ctrl-C or SIGTERM stops gc between two builds rather than inside
	// one's removal; a second one kills it, which is safe too (a build
	// leaves its place before its files go).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	// The warm images a server with the agent beside this binary restores;
	// without an agent to go by, those of every agent are current.
	agentHash := ""
	if p := paths.FindAgent(cfg.Agent); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			sum := sha256.Sum256(b)
			agentHash = hex.EncodeToString(sum[:])
		}
	}
	agentKey := agentHash
	if agentKey == "" {
		agentKey = "*" // a pattern: any agent's
	}
	current, currentWarm := map[string]string{}, []string{}
	for _, spec := range reg.List() {
		if b, ok := template.Lookup(cfg.CacheDir, spec); ok {
			current[sandbox.CanonicalPath(b.RootFS)] = "current build of " + spec.Name
			// Of this very build: the warm image of the build a --force
			// rebuild replaced has its rootfs path, not its files.
			currentWarm = append(currentWarm, filepath.Base(sandbox.WarmImageDirOfBuild(cfg.warmDir(), spec.Name, spec.Hash(), b.ID(), agentKey)))
		}
	}
	isCurrentWarm := func(name string) bool {
		for _, pattern := range currentWarm {
			if ok, _ := filepath.Match(pattern, name); ok {
				return true
			}
		}
		return false
	}
	// The server's store, never a new one: an empty store of a mistaken
	// data dir refers to nothing, and every build would look unused.
	if err := cfg.existingStore("template gc"); err != nil {
		return err
	}
	store, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	// A local store's manifests name their builds; an S3 store is not
	// opened: its snapshots count as of unknown builds all the same, and
	// opening it sweeps the snapshot cache of temp directories, the
	// downloads a running server has under way, whose restores then failed.
	var images pandastack.ImageStore
	if !strings.HasPrefix(cfg.SnapshotStore, "s3://") {
		if images, _, err = openImages(ctx, cfg); err != nil {
			return err
		}
	}
	refs, warm, err := sandbox.CollectRootFSRefs(ctx, sandbox.RefSources{
		Store: store, Images: images, PausedDir: cfg.pausedDir(), WarmDir: cfg.warmDir(),
		// The server's spelling of the cache dir may not be gc's.
		Current:     func(rootfs string) bool { return current[sandbox.CanonicalPath(rootfs)] != "" },
		CurrentWarm: isCurrentWarm,
		WarmMinAge:  minAge, DryRun: dryRun,
	})
	if err != nil {
		return fmt.Errorf("template gc: %w (nothing removed)", err)
	}
	verb := "removed"
	if dryRun {
		verb = "would remove"
	}
	var freed, freedWarm int64
	for _, r := range warm {
		freedWarm += r.Bytes
		fmt.Fprintf(w, "%s warm image %s (%d MB)\n", verb, r.Dir, r.Bytes>>20)
	}
	// Builds a --force rebuild set aside, and what killed builds left; one
	// still in use stays for a later run.
	left, err := template.RemoveStale(cfg.CacheDir, dryRun)
	if err != nil {
		fmt.Fprintf(w, "warning: %v\n", err)
	}
	for _, l := range left {
		freed += l.SizeBytes
		fmt.Fprintf(w, "%s leftover %s (%d MB)\n", verb, l.Dir, l.SizeBytes>>20)
	}
	res, err := template.GC(ctx, cfg.CacheDir, template.GCOptions{
		MinAge: minAge, DryRun: dryRun,
		Keep: func(b template.Built) (string, bool) {
			if why := current[sandbox.CanonicalPath(b.RootFS)]; why != "" {
				return why, true
			}
			return refs.Keeps(b.Name, b.RootFS, b.BuiltAt)
		},
	})
	if err != nil && ctx.Err() == nil {
		return err
	}
	for _, r := range res {
		if r.Removed {
			freed += r.Build.SizeBytes
			fmt.Fprintf(w, "%s %s (%d MB)\n", verb, r.Build.Dir, r.Build.SizeBytes>>20)
		} else {
			fmt.Fprintf(w, "kept %s: %s\n", r.Build.Dir, r.Reason)
		}
	}
	fmt.Fprintf(w, "%s %d MB of template builds and %d MB of warm images\n", verb, freed>>20, freedWarm>>20)
	if ctx.Err() != nil {
		return errors.New("template gc: interrupted: it did what it printed; run it again for the rest")
	}
	return nil
}
