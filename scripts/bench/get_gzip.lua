-- A GET that accepts gzip, as browsers and SDK clients fetch cards.
wrk.method = "GET"
wrk.headers["Accept-Encoding"] = "gzip"
