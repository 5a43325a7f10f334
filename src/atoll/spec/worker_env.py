"""Variables of the launcher -> worker environment contract that both sides name.

Read by the worker before anything heavy is imported: this module imports nothing.
"""

# "send": the worker's run folder is not the parent's (a Pod's emptyDir), so its results/ go to
# the parent over the worker link before it finishes (wire/results_archive.py).
RESULTS_HOME_VAR = "ATOLL_RESULTS_HOME"
SEND_RESULTS = "send"

# The site's privacy policy (local/privacy.yaml, as JSON), when the site has one: set by the
# site parent (site/app.py), read by the worker (fl/runner.py, fl/privacy/site_privacy.py).
POLICY_ENV = "ATOLL_PRIVACY_POLICY"
