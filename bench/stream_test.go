package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// The stream command writes exactly the bytes asked for, `yes` output all
// through, whether it is less than one copy of the source, a whole number
// of copies, or copies and a part.
func TestStreamCmd(t *testing.T) {
	path, err := hostStreamSource()
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	file := int64(streamSourceMiB) << 20
	for _, size := range []int64{1000, file, 2*file + 4096} {
		out, err := exec.Command("/bin/sh", "-c", streamCmd(path, size)).Output()
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if int64(len(out)) != size {
			t.Fatalf("size %d: got %d bytes", size, len(out))
		}
		if want := bytes.Repeat([]byte("y\n"), int(size/2)); !bytes.Equal(out, want) {
			t.Fatalf("size %d: not `yes` output", size)
		}
	}
}
