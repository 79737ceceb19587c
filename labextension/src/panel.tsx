/** The left-sidebar panel: collapsible sections, one component each (sections/index.ts). */

import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SECTIONS, SectionProps, SectionSpec } from './sections';

function Section(props: { id: string; title: string; open: boolean; children: React.ReactNode }) {
  const [open, setOpen] = React.useState(props.open);
  return (
    <section className={`jp-CloudTik-section ${open ? 'jp-mod-open' : ''}`} data-section={props.id}>
      <h2 className="jp-CloudTik-sectionTitle" onClick={() => setOpen(!open)}>
        <span className="jp-CloudTik-caret">{open ? '▾' : '▸'}</span> {props.title}
      </h2>
      {open && <div className="jp-CloudTik-sectionBody">{props.children}</div>}
    </section>
  );
}

/** A section that is only there when its hook says so (e.g. Side-kicks under a hub). */
function Gated(props: { spec: SectionSpec; props: SectionProps }): JSX.Element | null {
  const { spec } = props;
  const visible = spec.useVisible!(props.props);
  if (!visible) {
    return null;
  }
  return (
    <Section id={spec.id} title={spec.title} open={spec.open}>
      <spec.component {...props.props} />
    </Section>
  );
}

export class CloudTikPanel extends ReactWidget {
  constructor(private props: SectionProps) {
    super();
    this.addClass('jp-CloudTik-panel');
  }

  update(props?: Partial<SectionProps>): void {
    if (props) {
      this.props = { ...this.props, ...props };
    }
    super.update();
  }

  render(): JSX.Element {
    return (
      <div className="jp-CloudTik-sections">
        {SECTIONS.map(s =>
          s.useVisible ? (
            <Gated key={s.id} spec={s} props={this.props} />
          ) : (
            <Section key={s.id} id={s.id} title={s.title} open={s.open}>
              <s.component {...this.props} />
            </Section>
          )
        )}
      </div>
    );
  }
}
