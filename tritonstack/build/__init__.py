"""Build time: write a Triton model repository from presets, and check one offline."""
