// The index's filters and sort: progressive enhancement of the grouped list the page already is. Each card carries
// its kinds, attention kinds, size bucket, release month and the numbers it sorts by as data attributes (written
// by the build); this script only shows, hides and reorders the cards.
(function () {
  'use strict';
  const form = document.querySelector('form.index-filters');
  const flat = document.querySelector('.index-flat');
  if (!form || !flat) return;
  const cards = Array.from(document.querySelectorAll('.lab .model-card'));
  const home = cards.map(card => card.parentNode);  // each card's grid in the grouped list
  const count = form.querySelector('.index-count');
  form.hidden = false;

  function matches(card, field, value) {
    return !value || (card.dataset[field] || '').split('|').indexOf(value) >= 0;
  }

  function apply() {
    const kind = form.elements.kind.value, attention = form.elements.attention.value;
    const size = form.elements.size.value, sort = form.elements.sort.value;
    let shown = 0;
    for (const card of cards) {
      const keep = matches(card, 'kind', kind) && matches(card, 'attention', attention) && matches(card, 'size', size);
      card.hidden = !keep;
      if (keep) shown++;
    }
    if (sort) {
      const key = sort === 'released' ? (c => c.dataset.released) : (c => Number(c.dataset[sort]));
      const sorted = cards.slice().sort((a, b) => (key(a) < key(b)) - (key(a) > key(b)));  // largest first
      for (const card of sorted) flat.appendChild(card);
    } else {
      cards.forEach((card, i) => home[i].appendChild(card));  // back in the grouped order
    }
    flat.hidden = !sort;
    for (const section of document.querySelectorAll('.lab')) {
      section.hidden = Boolean(sort) || !section.querySelector('.model-card:not([hidden])');
    }
    count.textContent = shown === cards.length ? cards.length + ' models' : shown + ' of ' + cards.length + ' models';
  }

  form.addEventListener('change', apply);
  form.addEventListener('submit', ev => ev.preventDefault());
  apply();
})();
