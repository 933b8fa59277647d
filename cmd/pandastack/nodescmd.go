package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
)

// nodesCmd lists the nodes sharing the server's store, and forgets one
// retired for good: `pandastack nodes ls|forget`.
func nodesCmd(args []string) error {
	cfg := defaultConfig()
	if len(args) == 0 || isHelp(args[0]) {
		return verbsHelp(args, "usage: pandastack nodes ls|forget [flags] (pandastack nodes VERB -h for its flags)")
	}
	switch args[0] {
	case "ls", "list", "forget":
	default:
		return badUsage{fmt.Sprintf("nodes: unknown verb %q; want ls or forget", args[0])}
	}
	fs := flag.NewFlagSet("nodes "+args[0], flag.ContinueOnError)
	cfg.bind(fs)
	showOnly(fs, "data-dir", "store")
	if err := parseInterspersed(fs, args[1:]); err != nil {
		return err
	}
	switch {
	case args[0] == "forget" && fs.NArg() != 1:
		return badUsage{"usage: pandastack nodes forget ID (a lost node: see pandastack nodes ls)"}
	case args[0] != "forget" && fs.NArg() > 0:
		return badUsage{fmt.Sprintf("nodes ls: unexpected argument %q: it takes flags only", fs.Arg(0))}
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := cfg.existingStore("nodes " + args[0]); err != nil {
		return err
	}
	ctx := context.Background()
	store, _, err := openStore(ctx, &cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	if args[0] == "forget" {
		id := fs.Arg(0)
		n, err := store.ForgetNode(ctx, id, time.Now())
		if err != nil {
			return err
		}
		fmt.Printf("forgot node %s", id)
		if n > 0 {
			fmt.Printf("; its %d paused sandboxes, whose images were on its disk, are stopped (lost)", n)
		}
		fmt.Println()
		return nil
	}
	nodes, err := store.ListNodes(ctx)
	if err != nil {
		return err
	}
	printNodes(os.Stdout, nodes, time.Now())
	return nil
}

// printNodes writes the nodes as a table: when each last heartbeat, what
// it offers and the ready pool sandboxes it reported.
func printNodes(w io.Writer, nodes []pandastack.Node, now time.Time) {
	fmt.Fprintf(w, "%-22s %-5s %-28s %-14s %4s %9s %9s %s\n", "ID", "STATE", "URL", "HEARTBEAT", "CPUS", "MEMORY", "FREE", "POOL")
	for _, n := range nodes {
		var pool []string
		for _, t := range slices.Sorted(maps.Keys(n.Pool)) {
			pool = append(pool, fmt.Sprintf("%s=%d", t, n.Pool[t]))
		}
		beat := now.Sub(n.HeartbeatAt).Round(time.Second).String() + " ago"
		fmt.Fprintf(w, "%-22s %-5s %-28s %-14s %4d %6d MB %6d MB %s\n", printable(n.ID), n.State, printable(n.URL), beat,
			n.CPUs, n.MemoryMB, n.FreeMemoryMB, strings.Join(pool, ","))
	}
}
