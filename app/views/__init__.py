"""The page's views, one module each; app/streamlit_app.py only wires them together.

- session: the session's lab, and the sidebar's widgets <-> Settings;
- sidebar: mode, lesson picker, scenario, engine, the settings form, trace upload;
- main_view: the main area (a fragment on Play's timer): title, controls, lesson, status, tabs;
- controls: Reset / Step / Run N / Play / Back / Latest, Play speed, Projector, history slider;
- tabs: the registry of tabs (label -> the function drawing it);
- memory, events, waste, compare, watch, export: a tab each; lessons: the Lessons mode;
- common: ``Shown`` (what a tab draws from), ``chart`` (every figure, through the figure
  cache), "How to read this" (texts in help_texts), short errors, guarded callbacks;
- page_style: the page's CSS and JavaScript (files in assets/).

A view names what it calls in another module through that module (``pool_grid.pool_figure``,
``narration.narrate``), so what runs is what the module holds at that moment: a test may
replace a function there, as it could when the page script imported it afresh on every run.
"""
