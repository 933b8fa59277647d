package jupyter

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// Transport names the ZeroMQ transport between the client and a kernel.
type Transport string

const (
	// IPC uses Unix sockets in the kernel's private directory: nothing
	// else on the machine can reach them, and no ports are needed.
	IPC Transport = "ipc"
	// TCP uses loopback ports, picked free just before the kernel starts.
	TCP Transport = "tcp"
)

// connInfo is a Jupyter connection file.
type connInfo struct {
	Transport       Transport `json:"transport"`
	IP              string    `json:"ip"`
	ShellPort       int       `json:"shell_port"`
	IOPubPort       int       `json:"iopub_port"`
	StdinPort       int       `json:"stdin_port"`
	ControlPort     int       `json:"control_port"`
	HBPort          int       `json:"hb_port"`
	Key             string    `json:"key"`
	SignatureScheme string    `json:"signature_scheme"`
	KernelName      string    `json:"kernel_name"`
}

// newConnInfo picks the endpoints for a kernel whose private directory is
// dir. For IPC the "ports" are only suffixes of the socket paths.
func newConnInfo(t Transport, dir string, key []byte) (connInfo, error) {
	ci := connInfo{Transport: t, Key: string(key), SignatureScheme: "hmac-sha256"}
	switch t {
	case IPC:
		ci.IP = filepath.Join(dir, "k")
		ci.ShellPort, ci.IOPubPort, ci.StdinPort, ci.ControlPort, ci.HBPort = 1, 2, 3, 4, 5
	case TCP:
		ci.IP = "127.0.0.1"
		// Hold all listeners until every port is known so no two coincide.
		// Another process can still take one before the kernel binds it:
		// the kernel then fails to start and the caller may retry.
		var ports [5]int
		var ls []net.Listener
		defer func() {
			for _, l := range ls {
				l.Close()
			}
		}()
		for i := range ports {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return ci, fmt.Errorf("pick a port: %w", err)
			}
			ls = append(ls, l)
			ports[i] = l.Addr().(*net.TCPAddr).Port
		}
		ci.ShellPort, ci.IOPubPort, ci.StdinPort, ci.ControlPort, ci.HBPort = ports[0], ports[1], ports[2], ports[3], ports[4]
	default:
		return ci, fmt.Errorf("unknown transport %q", t)
	}
	return ci, nil
}

// endpoint is the ZeroMQ address of one of the kernel's sockets.
func (ci connInfo) endpoint(port int) string {
	if ci.Transport == IPC {
		return "ipc://" + ci.IP + "-" + strconv.Itoa(port)
	}
	return "tcp://" + net.JoinHostPort(ci.IP, strconv.Itoa(port))
}

// write stores the connection file readable by its owner only: it holds
// the signing key.
func (ci connInfo) write(path string) error {
	b, err := json.MarshalIndent(ci, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
