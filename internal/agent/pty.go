package agent

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// pty serves GET /v1/pty: a login shell of the sandbox user on a new
// pseudo-terminal, spoken to in PTY frames over the upgraded stream. The
// shell and everything it started are killed when the host closes the
// stream; when the shell exits the host gets its status and the stream ends.
func (s *Server) pty(w http.ResponseWriter, r *http.Request) error {
	if !strings.EqualFold(r.Header.Get("Upgrade"), agentproto.PTYUpgrade) {
		return pandastack.Errorf(pandastack.EInvalid, "a terminal needs \"Upgrade: %s\"", agentproto.PTYUpgrade)
	}
	q := r.URL.Query()
	cols, err1 := strconv.ParseUint(q.Get("cols"), 10, 16)
	rows, err2 := strconv.ParseUint(q.Get("rows"), 10, 16)
	if err1 != nil || err2 != nil || cols == 0 || rows == 0 {
		return pandastack.Errorf(pandastack.EInvalid, "cols and rows must be whole numbers from 1 to 65535")
	}
	dir := q.Get("cwd")
	if dir == "" {
		dir = s.home
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join(s.home, dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return pandastack.Errorf(pandastack.EInvalid, "cwd %s is not a directory", dir)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		return pandastack.Errorf(pandastack.EInternal, "this connection cannot be upgraded")
	}

	master, tty, err := openPTY(uint16(cols), uint16(rows))
	if err != nil {
		return err
	}
	defer master.Close()
	env, _ := buildEnv(s.home, agentproto.UserName, map[string]string{"TERM": "xterm-256color"})
	shell := "/bin/bash"
	if _, err := os.Stat(shell); err != nil {
		shell = "/bin/sh"
	}
	c, err := s.cfg.Reaper.Start(shell, []string{"-" + filepath.Base(shell)}, &os.ProcAttr{
		Dir: dir, Env: env, Files: []*os.File{tty, tty, tty}, Sys: ttyProcAttr(),
	})
	tty.Close() // the shell holds its own copies
	if err != nil {
		return startError(&execSpec{argv: []string{shell}}, err)
	}

	conn, brw, err := hj.Hijack()
	if err != nil {
		KillTree(c.Pid, c.Mark)
		<-c.Done
		return err
	}
	defer conn.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + agentproto.PTYUpgrade + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		KillTree(c.Pid, c.Mark)
		<-c.Done
		return nil
	}
	start := time.Now()
	var wmu sync.Mutex
	send := func(typ byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return agentproto.WritePTYFrame(conn, typ, p)
	}

	// A terminal filling the sandbox's memory is killed by the memory
	// watch, which says why on it, as a shell says "Killed". The note is
	// sent off the watch's goroutine (a client that reads slowly holds
	// send up), and before the exit frame (after it the host stops
	// reading). gone: the shell has exited, its pid may be reused.
	var (
		noteMu sync.Mutex
		gone   bool
		noted  chan struct{} // closed once the note is sent
	)
	ended := func() <-chan struct{} {
		noteMu.Lock()
		defer noteMu.Unlock()
		gone = true
		return noted
	}
	defer s.cfg.Contexts.guardMemory(c.Mark, "terminal", false, s.log, func(why string) {
		noteMu.Lock()
		defer noteMu.Unlock()
		if gone || noted != nil {
			return
		}
		ch := make(chan struct{})
		noted = ch
		go func() {
			defer close(ch)
			send(agentproto.PTYData, []byte("\r\n"+strings.TrimSpace(oomNote(why))+"\r\n"))
		}()
	}, func() {
		noteMu.Lock()
		exited := gone
		noteMu.Unlock()
		if exited {
			KillTree(0, c.Mark)
		} else {
			KillTree(c.Pid, c.Mark)
		}
	})()

	// Output: the shell's terminal to the host, until the terminal closes
	// (every holder of its other end is gone).
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		buf := make([]byte, outputChunk)
		for {
			n, err := master.Read(buf)
			if n > 0 && send(agentproto.PTYData, buf[:n]) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// Input: keystrokes and resizes from the host, until it hangs up.
	hostGone := make(chan struct{})
	go func() {
		defer close(hostGone)
		in := bufio.NewReader(io.MultiReader(brw.Reader, conn))
		for {
			typ, p, err := agentproto.ReadPTYFrame(in)
			if err != nil {
				return
			}
			switch typ {
			case agentproto.PTYData:
				if _, err := master.Write(p); err != nil {
					return
				}
			case agentproto.PTYResize:
				if cols, rows, err := agentproto.ParseResize(p); err == nil && cols > 0 && rows > 0 {
					resizePTY(master, cols, rows)
				}
			}
		}
	}()

	var status ExitStatus
	select {
	case status = <-c.Done:
		note := ended()
		// A background child may keep the terminal open: give the output a
		// moment to drain, then stop reading.
		drained(outDone, time.Now(), master)
		// What the shell left running dies with the terminal: its jobs
		// were re-parented when it exited (and its pid may be reused), so
		// by their mark.
		KillTree(0, c.Mark)
		master.Close()
		<-outDone
		if note != nil {
			<-note
		}
		send(agentproto.PTYExit, agentproto.ExitPayload(status.Code))
	case <-hostGone:
		KillTree(c.Pid, c.Mark)
		status = <-c.Done
		ended()
		master.Close()
		<-outDone
	}
	s.log.Info("terminal", "pid", c.Pid, "status", status.String(), "ms", time.Since(start).Milliseconds())
	return nil
}
