package pandastack

import "context"

// An image is what Runtime.Checkpoint wrote (memory, processes, the
// sandbox's own filesystem), sealed as a directory: manifest.json, which
// names every file of image/ with its size and CRC-32C checksum, and
// image/ itself. internal/imagestore writes and checks that format.

// ImageStore keeps the sealed images of snapshots, by snapshot id, where
// every server that shares it can restore them: a local directory, or
// S3-compatible object storage with a local cache. Restores always run from
// local files that were checked against their manifest first.
// Implementations are safe for concurrent use, also by several servers
// sharing one store, and return ENotFound for an image that does not exist,
// ESnapshotCorrupt for one whose files are missing, truncated or altered,
// EStorage when the local disk is full, and wrap any other failure (an
// unreachable object store) as a plain error.
type ImageStore interface {
	// Put stores the sealed image directory dir as image id and takes dir
	// over: when Put returns, on success or failure, dir is gone. It
	// returns the image's size in bytes (the files of image/). An existing
	// id is an EConflict. Cost: a rename for a local directory; an upload
	// of every byte for object storage. Cancelling ctx aborts an upload
	// and leaves nothing of it in the store.
	Put(ctx context.Context, id, dir string) (int64, error)
	// Open returns image id as a local directory whose files were checked
	// against its manifest just now. The directory stays until Close of
	// the returned image; a restore that opened its files may outlive it.
	// Cost: one pass over every byte to check it, plus, when the image is
	// not cached locally, a download of every byte (once: later Opens use
	// the cache). Cancelling ctx aborts a download; nothing partial is
	// kept.
	Open(ctx context.Context, id string) (OpenImage, error)
	// Delete removes image id everywhere the store keeps it (its local
	// cache of this server included). Deleting an unknown image is not an
	// error.
	Delete(ctx context.Context, id string) error
}

// OpenImage is an image made available on local disk by ImageStore.Open.
type OpenImage interface {
	// Dir is the image's sealed directory (manifest.json and image/).
	Dir() string
	// Close says the caller no longer needs Dir; the store may then evict it.
	Close() error
}
