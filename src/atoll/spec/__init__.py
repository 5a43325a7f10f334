"""Pure contracts: job meta, resources, launcher_spec, site config and study runtime.

Modules (import from them directly):
- errors: Issue, SpecError (every problem of a document, each with its path)
- quantity: memory sizes (``64Gi``)
- meta: JobMeta, load_meta (meta.json)
- resources: Resources, validate_resource_spec, resolve_resources (resource_spec)
- launcher_spec: allowlists per backend, validate_launcher_spec, resolve_launcher_spec
- site_config: SiteConfig, load_site_config (local/site.yaml)
- study_runtime: StudyRuntime, StudyEntry, load_study_runtime (local/study_runtime.yaml)
- docker_kwargs: which Docker run kwargs an operator may add
"""
