// Equation terms and the diagram parts they name light together: a term carries the ids of the parts that hold or
// produce it (data-light, space-separated), a part its own id. Hovering or focusing either side adds the class "lit"
// to everything that shares an id with it, and leaving or blurring it takes the class away.
(function () {
  'use strict';
  const ids = el => (el.getAttribute('data-light') || '').split(/\s+/).filter(Boolean);
  let lit = [];

  function clear() {
    for (const el of lit) el.classList.remove('lit');
    lit = [];
  }

  function light(event) {
    const source = event.target instanceof Element ? event.target.closest('[data-light]') : null;
    if (!source) return;
    clear();
    const wanted = new Set(ids(source));
    lit = [...document.querySelectorAll('[data-light]')].filter(el => ids(el).some(id => wanted.has(id)));
    for (const el of lit) el.classList.add('lit');
  }

  function unlight(event) {
    const source = event.target instanceof Element ? event.target.closest('[data-light]') : null;
    if (source && !source.contains(event.relatedTarget)) clear();
  }

  document.addEventListener('mouseover', light);
  document.addEventListener('focusin', light);
  document.addEventListener('mouseout', unlight);
  document.addEventListener('focusout', unlight);
})();
