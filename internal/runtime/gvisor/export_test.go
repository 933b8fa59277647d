package gvisor

// BootOldCaps makes r boot sandboxes as a server from before the agent held
// CAP_SYS_ADMIN did (capability revision 1), and their checkpoints leave
// no record of it, as that server's did.
func BootOldCaps(r *Runtime, old bool) {
	if old {
		r.bootCaps = 1
	} else {
		r.bootCaps = 0
	}
}

// ImageCapsFile is the name of an image's capability record.
const ImageCapsFile = imageCapsFile
