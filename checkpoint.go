package pandastack

import "context"

type compressedCheckpointKey struct{}

// WithCompressedCheckpoint asks the Runtime's Checkpoint under ctx to
// compress the image's memory (cheaply): for images that are written to
// wait on disk, such as an idle suspend's, where disk space is what bounds
// how many sandboxes one machine holds. Snapshots, forks and warm images
// stay uncompressed: they are restored often and fast.
func WithCompressedCheckpoint(ctx context.Context) context.Context {
	return context.WithValue(ctx, compressedCheckpointKey{}, true)
}

// CompressedCheckpoint reports whether ctx asks for a compressed image.
func CompressedCheckpoint(ctx context.Context) bool {
	v, _ := ctx.Value(compressedCheckpointKey{}).(bool)
	return v
}
