package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// NodesConfig makes serve one node of several sharing a PostgreSQL store
// (docs/deploy.md). On SQLite the one serve is the only node.
type NodesConfig struct {
	ID           string        // default: a stable id kept in <data dir>/node-id
	AdvertiseURL string        // where other nodes reach this one; default: http://<listen address>
	Heartbeat    time.Duration // how often it heartbeats
	Grace        time.Duration // silence after which a node's sandboxes are lost
	Placement    string        // spread (default) or local
}

// bind registers the flags with Config.bind's helpers (a flag wins over
// the variable, which wins over the default).
func (c *NodesConfig) bind(str func(p *string, name, env, usage string), dur func(p *time.Duration, name, env, usage string)) {
	d := sandbox.DefaultNodeConfig()
	c.Heartbeat, c.Grace, c.Placement = d.Heartbeat, d.Grace, "spread"
	str(&c.ID, "node-id", "PANDASTACK_NODE_ID", "this node's id among the serves sharing a store (default: one made once and kept in <data dir>/node-id)")
	str(&c.AdvertiseURL, "advertise-url", "PANDASTACK_ADVERTISE_URL", "base URL other nodes forward requests to (default: http://<listen address>)")
	dur(&c.Heartbeat, "node-heartbeat", "PANDASTACK_NODE_HEARTBEAT", "how often this node heartbeats in the store")
	dur(&c.Grace, "node-grace", "PANDASTACK_NODE_GRACE", "a node silent this long is lost: its sandboxes are stopped with stop_reason lost")
	str(&c.Placement, "placement", "PANDASTACK_PLACEMENT", "where creates run: spread (the node with the most free capacity) or local (the node asked)")
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func (c *NodesConfig) validate() error {
	if c.ID != "" && !nodeIDPattern.MatchString(c.ID) {
		return fmt.Errorf("node id %q: want 1 to 63 letters, digits, '.', '_' or '-'", c.ID)
	}
	if c.Heartbeat <= 0 || c.Grace < 2*c.Heartbeat {
		return fmt.Errorf("node heartbeat %s must be positive and the grace period %s at least twice it", c.Heartbeat, c.Grace)
	}
	if c.Placement != "spread" && c.Placement != "local" {
		return fmt.Errorf("placement %q: want spread or local", c.Placement)
	}
	if c.AdvertiseURL != "" {
		u, err := url.Parse(c.AdvertiseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("advertise URL %q: want http(s)://host:port", c.AdvertiseURL)
		}
	}
	return nil
}

// node returns the manager's node settings: the id (made and kept in the
// data dir on first start), the advertised URL and the timings.
func (c *NodesConfig) node(dataDir, listen string, sharedImages bool) (sandbox.NodeConfig, error) {
	id, err := c.nodeID(dataDir)
	if err != nil {
		return sandbox.NodeConfig{}, err
	}
	adv := strings.TrimSuffix(c.AdvertiseURL, "/")
	if adv == "" {
		adv, err = advertised(listen)
		if err != nil {
			return sandbox.NodeConfig{}, err
		}
	}
	return sandbox.NodeConfig{
		ID: id, URL: adv, Heartbeat: c.Heartbeat, Grace: c.Grace,
		PlaceRestores: sharedImages, PlaceLocal: c.Placement == "local",
		StartedFile: filepath.Join(dataDir, "node-started"),
	}, nil
}

func (c *NodesConfig) nodeID(dataDir string) (string, error) {
	if c.ID != "" {
		return c.ID, nil
	}
	path := filepath.Join(dataDir, "node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if !nodeIDPattern.MatchString(id) {
			return "", fmt.Errorf("%s holds %q, not a node id", path, id)
		}
		return id, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	id := pandastack.NewID("node")
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keep node id: %w", err)
	}
	return id, nil
}

// advertised makes a URL of a listen address: its host, or this host's
// name when it listens on every address.
func advertised(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("no --advertise-url and no host name: %w", err)
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
