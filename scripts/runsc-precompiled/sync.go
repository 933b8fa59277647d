package main

// A checkpoint's flush of each gofer file system (the sandbox's root, its
// read-only binds) and the edit that has it flush only the files opened
// for writing (see the package doc and syncSource).
const goferSaveFile = "pkg/sentry/fsimpl/gofer/save_restore.go"

var goferSaveEdits = []edit{
	{
		"\t// Flush local state to the remote filesystem.\n\tif err := fs.Sync(ctx); err != nil {\n",
		"\t// Flush local state to the remote filesystem.\n" +
			"\t// PandaStack (scripts/runsc-precompiled): what was opened for writing\n" +
			"\t// (pandastack_sync.go).\n" +
			"\tif err := fs.pandastackSyncWritten(ctx); err != nil {\n",
	},
}

// syncFile is the file -patch adds to the gofer file system's package,
// syncSource its content.
const syncFile = "pkg/sentry/fsimpl/gofer/pandastack_sync.go"

const syncSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package gofer

import "gvisor.dev/gvisor/pkg/context"

// pandastackSyncWritten is Sync for a checkpoint (PrepareSave): it flushes
// the files opened for writing, their cached pages and then the host's
// copy, and leaves the others alone. Sync also fsyncs every other file and
// directory the sandbox has open, one system call each: none holds a
// cached page (those need a handle for writing), so what a checkpoint
// gives up is only the host's durability of those files and directories
// across a host crash. A sandbox that has opened about 150 files of its
// root file system (a Python kernel's imports) spent 8-12 ms of every
// checkpoint there.
func (fs *filesystem) pandastackSyncWritten(ctx context.Context) error {
	fs.syncMu.Lock()
	var ds []*dentry
	for elem := fs.syncableDentries.Front(); elem != nil; elem = elem.Next() {
		d := elem.d
		d.inode.handleMu.RLock()
		written := d.inode.isWriteHandleOk()
		d.inode.handleMu.RUnlock()
		if written {
			ds = append(ds, d)
		}
	}
	var sffds []*specialFileFD
	for sffd := fs.specialFileFDs.Front(); sffd != nil; sffd = sffd.Next() {
		if sffd.vfsfd.IsWritable() {
			sffds = append(sffds, sffd)
		}
	}
	fs.syncMu.Unlock()
	var retErr error
	for _, d := range ds {
		if err := d.syncCachedFile(ctx, true /* forFilesystemSync */, false /* dataOnly */); err != nil {
			ctx.Infof("gofer.filesystem.pandastackSyncWritten: dentry.syncCachedFile failed: %v", err)
			if retErr == nil {
				retErr = err
			}
		}
	}
	for _, sffd := range sffds {
		if err := sffd.sync(ctx, true /* forFilesystemSync */, false /* dataOnly */); err != nil {
			ctx.Infof("gofer.filesystem.pandastackSyncWritten: specialFileFD.sync failed: %v", err)
			if retErr == nil {
				retErr = err
			}
		}
	}
	return retErr
}
`
