"""`atoll dashboard`: a live view of one study in the browser (docs/dashboard.md).

The dashboard is a small local web server that speaks to the federation's server with the
user's own admin kit, exactly as the CLI does (the server scopes every answer to the study):

    access.py      the one-time token, the session cookie, CSRF and host checks (every route)
    federation.py  the calls to the server (admin.Session) and the live loops behind the pages
    app.py         the routes: pages, JSON, server-sent events, downloads
    serve.py       binding a port, printing the URL, running until Ctrl-C
    static/        the pages (HTML, JS, CSS); the chart library is served from plotly's wheel

No key, certificate or server session ever reaches the browser: it holds a random cookie that
means something to this process alone.
"""
