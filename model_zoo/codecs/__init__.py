"""Video codecs: the TAEHV-style tiny codec, the 5-branch G-buffer encoder and the Wan2.1 VAE."""
