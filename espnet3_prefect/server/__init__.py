"""The Prefect server a run talks to: the embedded one (``embedded``), its guard (``guard``: it stops
with the run that started it), the watch that ends a run whose server died (``watch``), the ones left
running (``registry``), its services (``services``), port (``port``), listen address (``host``), basic auth
(``auth``), HTTPS certificate (``https``) and launcher (``serve``), its state folder (``state_home``),
links to recorded runs (``run_links``) and deployment steps for ``prefect.yaml`` (``deploy_steps``).
A plug: it imports only the ground floor (``disk``: the client file, the layout) and only the front
doors (``cli``, ``entry``, ``launch``) import it."""
