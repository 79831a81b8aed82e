"""What an encoded input is, read from its bytes before anything decodes it: image
and clip headers (video_header), what DALI's decoder is certain to refuse
(decodable), the pixels a request may cost (decode_budget), and a regions request's
boxes (regions). Clients, the backends, the build's checker and the launcher share
these rules; NumPy and Pillow are all they import."""
