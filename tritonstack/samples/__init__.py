"""Inputs that need no download: real photos from scikit-image's wheel with labelled
good and bad variants (photos), and the weighted corpus of encoded photos the load
test and the benchmark send (corpus)."""
