"""Files in and out: G-buffer readers (teacher mp4 folders, image sequences, npy windows), image
files, resizing, the synthetic clip, and the sinks that write frames and G-buffers atomically."""
