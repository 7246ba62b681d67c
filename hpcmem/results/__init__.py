"""Results: records -> summary (``aggregate``) -> references and history -> verdict
(``check``) -> HTML page (``report``)."""
