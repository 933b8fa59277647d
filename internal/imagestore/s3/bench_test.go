package s3_test

import (
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/testutil"
)

// benchImage is about the size of a warm code-interpreter snapshot (the
// e2e test measured 38-104 MB).
const benchImageBytes = 100 << 20

// BenchmarkImageStores measures, on this machine and a loopback versitygw,
// what a snapshot and a restore pay for their store: Put (the local rename
// vs the upload) and Open (checking the local files vs a download into an
// empty cache vs checking a cached copy).
//
//	go test -run '^$' -bench ImageStores -benchtime 5x ./internal/imagestore/s3/
func BenchmarkImageStores(b *testing.B) {
	srv := testutil.StartS3(b)
	pages := make([]byte, benchImageBytes)
	rand.Read(pages)
	files := map[string][]byte{"pages.img": pages, "checkpoint.img": pages[:1<<20]}
	local := imagestore.NewLocal(b.TempDir())
	bucket := srv.NewBucket(b)
	remote := func(cache string) pandastack.ImageStore { return newStore(b, srv, bucket, cache) }
	up := remote(b.TempDir())

	for _, st := range []struct {
		name string
		s    pandastack.ImageStore
	}{{"local", local}, {"s3", up}} {
		b.Run("Put/"+st.name, func(b *testing.B) {
			b.SetBytes(benchImageBytes)
			for i := range b.N {
				b.StopTimer()
				dir := sealFiles(b, files)
				b.StartTimer()
				if _, err := st.s.Put(b.Context(), fmt.Sprintf("snap_put_%s_%d_%s", st.name, i, pandastack.NewID("b")), dir); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	if _, err := local.Put(b.Context(), "snap_open", sealFiles(b, files)); err != nil {
		b.Fatal(err)
	}
	if _, err := up.Put(b.Context(), "snap_open", sealFiles(b, files)); err != nil {
		b.Fatal(err)
	}
	open := func(b *testing.B, s pandastack.ImageStore) {
		img, err := s.Open(b.Context(), "snap_open")
		if err != nil {
			b.Fatal(err)
		}
		img.Close()
	}
	b.Run("Open/local", func(b *testing.B) {
		b.SetBytes(benchImageBytes)
		for range b.N {
			open(b, local)
		}
	})
	b.Run("Open/s3-download", func(b *testing.B) {
		b.SetBytes(benchImageBytes)
		for range b.N {
			b.StopTimer()
			s := remote(b.TempDir()) // another server: an empty cache
			b.StartTimer()
			open(b, s)
		}
	})
	b.Run("Open/s3-cached", func(b *testing.B) {
		b.SetBytes(benchImageBytes)
		s := remote(b.TempDir())
		open(b, s)
		b.ResetTimer()
		for range b.N {
			open(b, s)
		}
	})
}
